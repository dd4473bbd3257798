"""Reporters named by TrainingArguments.report_to; each optional package is imported lazily in its own module."""

from __future__ import annotations

import importlib
import importlib.util
import os

# name -> (module, callback class); lathe's own jsonl needs nothing installed.
REPORTERS = {
    "jsonl": ("lathe.train.callbacks.reporters.jsonl", "JsonlLoggerCallback"),
    "kubeflow": ("lathe.train.callbacks.reporters.kubeflow", "KubeflowCallback"),
    "mlflow": ("lathe.train.callbacks.reporters.mlflow", "MLflowCallback"),
    "tensorboard": ("lathe.train.callbacks.reporters.tensorboard", "TensorBoardCallback"),
    "trackio": ("lathe.train.callbacks.reporters.trackio", "TrackioCallback"),
    "wandb": ("lathe.train.callbacks.reporters.wandb", "WandbCallback"),
}

# Logged once per run, not per step: wandb keeps them in the run summary, trackio leaves them out.
SINGLE_VALUE_SCALARS = (
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "total_flos",
)


def available_reporters() -> list[str]:
    """What report_to="all" means: the installed integrations, in transformers' order (jsonl is lathe's own,
    so "all" leaves it out, as transformers would)."""
    installed = []
    if os.getenv("DISABLE_MLFLOW_INTEGRATION", "FALSE").upper() != "TRUE" and importlib.util.find_spec("mlflow"):
        installed.append("mlflow")
    # As transformers: either package gives a SummaryWriter (tensorboardX comes with ray, for one).
    if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
        installed.append("tensorboard")
    for name in ("wandb", "trackio"):
        if importlib.util.find_spec(name):
            installed.append(name)
    return installed + with_kubeflow([])


def with_kubeflow(report_to: list[str]) -> list[str]:
    """transformers adds 'kubeflow' to every report_to inside a Kubeflow TrainJob."""
    from lathe.train.callbacks.reporters.kubeflow import kubeflow_requested

    if kubeflow_requested() and "kubeflow" not in report_to:
        return [*report_to, "kubeflow"]
    return report_to


def reporter_callbacks(report_to) -> list:
    """Callback classes for the names in report_to ("none" / [] means no reporter)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    callbacks = []
    for name in names:
        if name in ("none", None):
            continue
        if name not in REPORTERS:
            raise ValueError(f"report_to={name!r} is not supported; lathe reports to {sorted(REPORTERS)} or 'none'.")
        module, attribute = REPORTERS[name]
        callbacks.append(getattr(importlib.import_module(module), attribute))
    return callbacks


def rewrite_logs(logs: dict) -> dict:
    """transformers' metric names for trackers: eval_x -> eval/x, test_x -> test/x, anything else train/x."""
    rewritten = {}
    for key, value in logs.items():
        if key.startswith("eval_"):
            rewritten["eval/" + key[len("eval_") :]] = value
        elif key.startswith("test_"):
            rewritten["test/" + key[len("test_") :]] = value
        else:
            rewritten["train/" + key] = value
    return rewritten


def run_config(args, model) -> dict:
    """The arguments, under the model's config (and PEFT config), as trackers record a run's settings."""
    combined = args.to_dict()
    config = getattr(model, "config", None)
    if config is not None:
        combined = {**(config if isinstance(config, dict) else config.to_dict()), **combined}
    if getattr(model, "peft_config", None) is not None:
        combined = {"peft_config": model.peft_config, **combined}
    return combined
