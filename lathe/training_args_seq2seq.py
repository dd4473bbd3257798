"""transformers.training_args_seq2seq's import path."""

from lathe.train.args.training_args import Seq2SeqTrainingArguments  # noqa: F401
