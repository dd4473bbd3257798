"""transformers.trainer_jit_checkpoint's import path."""

from lathe.train.callbacks.jit_checkpoint import (  # noqa: F401
    CheckpointManager,
    JITCheckpointCallback,
    logger,  # noqa: F401
)
