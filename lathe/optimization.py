"""transformers.optimization's import path."""

from lathe.train.adafactor import Adafactor  # noqa: F401
from lathe.train.optim import get_scheduler  # noqa: F401
