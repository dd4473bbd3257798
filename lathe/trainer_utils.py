"""transformers.trainer_utils's import path."""

from lathe.train.args_enums import IntervalStrategy, SaveStrategy, SchedulerType  # noqa: F401
from lathe.train.args_integrations import HubStrategy  # noqa: F401
from lathe.train.checkpoint import PREFIX_CHECKPOINT_DIR, get_last_checkpoint  # noqa: F401
from lathe.train.evaluation import speed_metrics  # noqa: F401
from lathe.train.outputs import EvalLoopOutput, EvalPrediction, PredictionOutput, TrainOutput  # noqa: F401
from lathe.train.seed import enable_full_determinism, set_seed  # noqa: F401
