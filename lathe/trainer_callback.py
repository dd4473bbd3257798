"""transformers.trainer_callback's import path."""

from lathe.train.callbacks.events import (  # noqa: F401
    CallbackHandler,
    DefaultFlowCallback,
    TrainerCallback,
    logger,  # noqa: F401  (the callbacks' logger, as transformers.trainer_callback.logger)
)
from lathe.train.callbacks.flow import EarlyStoppingCallback, PrinterCallback, ProgressCallback  # noqa: F401
from lathe.train.state import ExportableState, TrainerControl, TrainerState  # noqa: F401
