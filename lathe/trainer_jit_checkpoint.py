"""transformers.trainer_jit_checkpoint's import path."""

from lathe.train.callbacks.jit_checkpoint import CheckpointManager, JITCheckpointCallback  # noqa: F401
from lathe.train.callbacks.jit_checkpoint import logger  # noqa: F401
