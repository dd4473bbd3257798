"""transformers.trainer_seq2seq's import path."""

from lathe.train.seq2seq import Seq2SeqTrainer  # noqa: F401
