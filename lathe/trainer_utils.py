"""transformers.trainer_utils's import path."""

from lathe.train.args.enums import IntervalStrategy, SaveStrategy, SchedulerType  # noqa: F401
from lathe.train.args.integrations import HubStrategy  # noqa: F401
from lathe.train.checkpoints.layout import PREFIX_CHECKPOINT_DIR, get_last_checkpoint  # noqa: F401
from lathe.train.checkpoints.rotation import rotate_checkpoints, sort_checkpoints  # noqa: F401
from lathe.train.checkpoints.weights import load_sharded_checkpoint  # noqa: F401
from lathe.train.evaluation.loop import speed_metrics  # noqa: F401
from lathe.train.evaluation.outputs import EvalLoopOutput, EvalPrediction, PredictionOutput, TrainOutput  # noqa: F401
from lathe.train.optim.optimizers import check_target_module_exists  # noqa: F401
from lathe.train.resume import compare_trainer_and_checkpoint_args  # noqa: F401
from lathe.train.seed import enable_full_determinism, set_seed  # noqa: F401
