"""lathe.llm data: the dataset registry, loading, format conversion, tokenization cache and the processors."""
