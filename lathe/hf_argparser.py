"""transformers.hf_argparser's import path."""

from lathe.train.argparser import HfArgumentParser  # noqa: F401
