"""report_to="trackio": metrics to trackio's local database, as transformers' TrackioCallback logs them."""

from __future__ import annotations

from lathe.train.callbacks.events import TrainerCallback
from lathe.train.callbacks.reporters import SINGLE_VALUE_SCALARS, rewrite_logs, run_config


def _import_trackio():
    try:
        import trackio
    except ImportError as error:
        raise ImportError("report_to='trackio' needs the trackio package: pip install 'lathe[trackio]'") from error
    return trackio


class TrackioCallback(TrainerCallback):
    """A trackio run in project `args.project` named `args.run_name`: the arguments as its config, every log
    with transformers' names (train/loss, eval/loss) and `train/global_step`. Stored locally (TRACKIO_DIR);
    the Hub Space options are refused by TrainingArguments, since lathe works offline."""

    def __init__(self):
        self._trackio = _import_trackio()
        self._initialized = False

    def setup(self, args, state, model):
        if state.is_world_process_zero:
            self._trackio.init(project=args.project, name=args.run_name, resume="allow")
            self._trackio.config.update(run_config(args, model), allow_val_change=True)
            if hasattr(model, "num_parameters"):
                self._trackio.config["model/num_parameters"] = model.num_parameters()
        self._initialized = True

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not self._initialized:
            self.setup(args, state, model)

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if not self._initialized:
            self.setup(args, state, model)
        if state.is_world_process_zero:
            steps = {key: value for key, value in logs.items() if key not in SINGLE_VALUE_SCALARS}
            self._trackio.log({**rewrite_logs(steps), "train/global_step": state.global_step})

    def on_predict(self, args, state, control, metrics, **kwargs):
        if not self._initialized:
            self.setup(args, state, kwargs.get("model"))
        if state.is_world_process_zero:
            self._trackio.log(rewrite_logs(metrics))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self._initialized:
            try:
                self._trackio.finish()
            finally:
                self._initialized = False
