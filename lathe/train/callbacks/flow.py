"""The default callbacks besides DefaultFlowCallback (events.py, as in transformers' trainer_callback):
progress and print output, EarlyStoppingCallback, GracefulStopCallback, and the handler a Trainer starts with."""

from __future__ import annotations

import logging

from lathe.train.callbacks.events import CallbackHandler, DefaultFlowCallback, TrainerCallback
from lathe.train.state import ExportableState

logger = logging.getLogger(__name__)


def _format_logs(logs: dict, max_str_len: int = 100) -> dict:
    shown = {}
    for key, value in logs.items():
        if key == "total_flos":
            continue
        if isinstance(value, str) and len(value) > max_str_len:
            value = f"[string of length {len(value)} not shown]"
        elif isinstance(value, float):
            value = f"{value:.4g}"
        shown[key] = value
    return shown


class ProgressCallback(TrainerCallback):
    """tqdm bars for training and evaluation; logs are written above the bar."""

    def __init__(self, max_str_len: int = 100):
        self.training_bar = None
        self.prediction_bar = None
        self.max_str_len = max_str_len
        self.current_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        from tqdm.auto import tqdm

        if state.is_world_process_zero:
            self.training_bar = tqdm(total=state.max_steps, initial=state.global_step, dynamic_ncols=True)
        self.current_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.update(state.global_step - self.current_step)
            self.current_step = state.global_step

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if not state.is_world_process_zero:
            return
        try:
            total = len(eval_dataloader)
        except TypeError:
            return
        if self.prediction_bar is None:
            from tqdm.auto import tqdm

            self.prediction_bar = tqdm(total=total, leave=self.training_bar is None, dynamic_ncols=True)
        self.prediction_bar.update(1)

    def _close_prediction_bar(self):
        if self.prediction_bar is not None:
            self.prediction_bar.close()
        self.prediction_bar = None

    def on_evaluate(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._close_prediction_bar()

    def on_predict(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._close_prediction_bar()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.write(str(_format_logs(logs, self.max_str_len)))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None


class PrinterCallback(TrainerCallback):
    """Prints each log dict (used instead of ProgressCallback when disable_tqdm)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        # transformers' PrinterCallback pops total_flos from the dict itself, on every rank: the train
        # metrics train() returns (which the example scripts save to train_results.json) lose it too
        if logs is not None:
            logs.pop("total_flos", None)
        if state.is_local_process_zero and logs is not None:
            print(_format_logs(logs))


class EarlyStoppingCallback(TrainerCallback, ExportableState):
    """Stops training when `metric_for_best_model` has not improved by more than
    `early_stopping_threshold` for `early_stopping_patience` evaluations."""

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0):
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold or 0.0
        self.early_stopping_patience_counter = 0

    def check_metric_value(self, args, state, control, metric_value):
        best = state.best_metric
        if best is None:
            improved = True
        else:
            better = metric_value > best if args.greater_is_better else metric_value < best
            improved = better and abs(metric_value - best) > self.early_stopping_threshold
        if improved:
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args, state, control, **kwargs):
        if args.metric_for_best_model is None:
            raise ValueError("EarlyStoppingCallback needs TrainingArguments.metric_for_best_model (e.g. 'loss').")
        if args.eval_strategy == "no":
            raise ValueError("EarlyStoppingCallback needs an eval_strategy of 'steps' or 'epoch', not 'no'.")
        if not args.load_best_model_at_end:
            logger.warning(
                "EarlyStoppingCallback without load_best_model_at_end=True: the best model will not be "
                "loaded automatically when training stops."
            )

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        name = args.metric_for_best_model
        if not name.startswith("eval_"):
            name = f"eval_{name}"
        value = metrics.get(name)
        if value is None:
            logger.warning(
                "Early stopping needs the metric %r, which evaluation did not return; early stopping is off.", name
            )
            return
        self.check_metric_value(args, state, control, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict:
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter},
        }


class GracefulStopCallback(TrainerCallback):
    """On SIGTERM or SIGINT (pre-emption, Ctrl-C): finish the current update step, save a
    checkpoint, and end training cleanly, so `train(resume_from_checkpoint=True)` loses nothing.

    Opt in with `trainer.add_callback(GracefulStopCallback())`. A second signal while stopping
    gets the previous handler (Ctrl-C twice still interrupts). Handlers are installed only in the
    main thread and restored at the end of training.
    """

    def __init__(self, signals=None):
        import signal

        self.signals = tuple(signals) if signals is not None else (signal.SIGTERM, signal.SIGINT)
        self.stop_requested = False
        self._previous = {}

    def _handle(self, signum, frame):
        import signal

        if self.stop_requested:
            previous = self._previous.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous)
            signal.raise_signal(signum)
            return
        logger.warning("Received signal %d: finishing this step, saving a checkpoint, then stopping.", signum)
        self.stop_requested = True

    def on_train_begin(self, args, state, control, **kwargs):
        import signal
        import threading

        self.stop_requested = False
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop_requested:
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        import signal

        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


def default_callback_handler(trainer, callbacks) -> CallbackHandler:
    """The Trainer's callbacks, in the order they run: flow, then the printer or progress bar, then the
    report_to reporters, then the JIT checkpoint (its SIGTERM handler set now, as transformers), then the user's."""
    from lathe.train.callbacks.reporters import reporter_callbacks

    args = trainer.args
    defaults = [DefaultFlowCallback, PrinterCallback if args.disable_tqdm else ProgressCallback]
    defaults += reporter_callbacks(args.report_to)
    if getattr(args, "enable_jit_checkpoint", False):
        from lathe.train.callbacks.jit_checkpoint import JITCheckpointCallback

        defaults.append(JITCheckpointCallback())
        defaults[-1].set_trainer(trainer)
    if "underflow_overflow" in getattr(args, "debug", ()):
        from lathe.train.callbacks.debug import UnderflowOverflowCallback

        defaults.append(UnderflowOverflowCallback())
    # CallbackHandler warns when no DefaultFlowCallback is left (as transformers' handler does).
    return CallbackHandler(
        defaults + list(callbacks or []),
        trainer.model,
        trainer.processing_class,
        trainer.optimizer,
        trainer.lr_scheduler,
    )
