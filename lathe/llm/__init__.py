"""lathe.llm: the LLaMA-Factory-style workflow (`lathe train|chat|api|export`) on lathe.train; never imported by it."""
