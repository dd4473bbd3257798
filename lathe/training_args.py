"""transformers.training_args's import path."""

from lathe.train.args import OptimizerNames, ParallelMode, TrainingArguments  # noqa: F401
from lathe.train.argparser_types import string_to_bool as str_to_bool  # noqa: F401
