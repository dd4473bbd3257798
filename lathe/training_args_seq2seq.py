"""transformers.training_args_seq2seq's import path."""

from lathe.train.args import Seq2SeqTrainingArguments  # noqa: F401
