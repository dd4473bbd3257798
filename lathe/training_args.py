"""transformers.training_args's import path."""

from lathe.train.args.parser_types import string_to_bool as str_to_bool  # noqa: F401
from lathe.train.args.training_args import OptimizerNames, ParallelMode, TrainingArguments  # noqa: F401
