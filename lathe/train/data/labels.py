"""IGNORE_INDEX: the label value that no loss is computed on, -100 as in transformers and torch's
cross_entropy (prompt tokens, padding, positions a collator masks out). Its one definition: lathe.train
and lathe.llm import it from here, and this module imports nothing, so torch-free code can too."""

IGNORE_INDEX = -100
