"""transformers.trainer's import path: from lathe.trainer import Trainer."""

from lathe.train.trainer import (
    Trainer,  # noqa: F401
    logger,  # noqa: F401  (the Trainer's logger, as transformers.trainer.logger)
)
