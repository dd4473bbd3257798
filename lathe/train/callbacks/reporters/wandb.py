"""report_to="wandb": metrics to Weights & Biases, as transformers' WandbCallback logs them; offline unless
WANDB_MODE says otherwise (lathe trains offline; `wandb sync` uploads a run later)."""

from __future__ import annotations

import os

from lathe.train.callbacks.events import TrainerCallback
from lathe.train.callbacks.reporters import SINGLE_VALUE_SCALARS, rewrite_logs, run_config


def _import_wandb():
    try:
        import wandb
    except ImportError as error:
        raise ImportError("report_to='wandb' needs the wandb package: pip install 'lathe[wandb]'") from error
    return wandb


class WandbCallback(TrainerCallback):
    """One wandb run per training run: the arguments (and model config) as its config, every log as a step
    keyed by `train/global_step` with transformers' names (train/loss, eval/loss), the end-of-training
    numbers (train_runtime, train_loss, ...) in the run summary. WANDB_PROJECT names the project
    ("huggingface"), WANDB_WATCH ("gradients", "parameters", "all") watches the model."""

    def __init__(self):
        self._wandb = _import_wandb()
        self._initialized = False
        log_model = os.getenv("WANDB_LOG_MODEL", "false").lower()
        if log_model not in ("false", "0", "no", ""):
            raise ValueError(
                f"WANDB_LOG_MODEL={log_model!r}: uploading models as wandb artifacts is not supported by lathe; "
                "unset it (checkpoints stay in output_dir)."
            )

    def setup(self, args, state, model):
        self._initialized = True
        if not state.is_world_process_zero:
            return
        init_args = {}
        if state.trial_name is not None:
            init_args.update(name=state.trial_name, group=args.run_name or args.output_dir)
        elif args.run_name is not None:
            init_args["name"] = args.run_name
        if self._wandb.run is None:
            mode = os.getenv("WANDB_MODE") or "offline"
            self._wandb.init(project=os.getenv("WANDB_PROJECT", "huggingface"), mode=mode, **init_args)
        self._wandb.config.update(run_config(args, model), allow_val_change=True)
        self._wandb.define_metric("train/global_step")
        self._wandb.define_metric("*", step_metric="train/global_step", step_sync=True)
        watch = os.getenv("WANDB_WATCH", "false")
        if watch in ("all", "parameters", "gradients"):
            self._wandb.watch(model, log=watch, log_freq=max(100, state.logging_steps))
        if hasattr(model, "num_parameters"):
            self._wandb.config["model/num_parameters"] = model.num_parameters()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.is_hyper_param_search:  # one run per trial
            self._wandb.finish()
            self._initialized = False
            args.run_name = None
        if not self._initialized:
            self.setup(args, state, model)

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if not self._initialized:
            self.setup(args, state, model)
        if not state.is_world_process_zero:
            return
        for key, value in logs.items():
            if key in SINGLE_VALUE_SCALARS:
                self._wandb.run.summary[key] = value
        steps = {key: value for key, value in logs.items() if key not in SINGLE_VALUE_SCALARS}
        self._wandb.log({**rewrite_logs(steps), "train/global_step": state.global_step})

    def on_predict(self, args, state, control, metrics, **kwargs):
        if not self._initialized:
            self.setup(args, state, kwargs.get("model"))
        if state.is_world_process_zero:
            self._wandb.log(rewrite_logs(metrics))
