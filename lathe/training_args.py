"""transformers.training_args's import path."""

from lathe.train.args import OptimizerNames, TrainingArguments  # noqa: F401
