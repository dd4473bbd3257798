"""report_to="mlflow": parameters and metrics to MLflow, as transformers' MLflowCallback logs them."""

from __future__ import annotations

import json
import logging
import os
import re

from lathe.train.callbacks.events import TrainerCallback
from lathe.train.callbacks.reporters import run_config

logger = logging.getLogger(__name__)
_TRUE = ("1", "ON", "YES", "TRUE")


def _import_mlflow():
    try:
        import mlflow
    except ImportError as error:
        raise ImportError("report_to='mlflow' needs the mlflow package: pip install 'lathe[mlflow]'") from error
    return mlflow


class MLflowCallback(TrainerCallback):
    """A run (MLFLOW_TRACKING_URI: where, e.g. a local `sqlite:///mlflow.db` or `file:./mlruns`;
    MLFLOW_EXPERIMENT_NAME, MLFLOW_RUN_ID, MLFLOW_NESTED_RUN, MLFLOW_TAGS, MLFLOW_FLATTEN_PARAMS,
    MLFLOW_MAX_LOG_PARAMS as in transformers) holding the arguments as parameters (values over MLflow's
    length limit left out, with a warning) and every numeric log as a metric at the global step.
    The run is ended at the end of training when this callback started it."""

    def __init__(self):
        self._ml_flow = _import_mlflow()
        self._initialized = False
        self._auto_end_run = False
        if os.getenv("HF_MLFLOW_LOG_ARTIFACTS", "FALSE").upper() in _TRUE:
            raise ValueError("HF_MLFLOW_LOG_ARTIFACTS: logging checkpoints as MLflow models is not supported by lathe.")

    def setup(self, args, state, model):
        self._initialized = True
        if not state.is_world_process_zero:
            return
        mlflow = self._ml_flow
        if not mlflow.is_tracking_uri_set() and os.getenv("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
        nested = os.getenv("MLFLOW_NESTED_RUN", "FALSE").upper() in _TRUE
        if mlflow.active_run() is None or nested or os.getenv("MLFLOW_RUN_ID"):
            if os.getenv("MLFLOW_EXPERIMENT_NAME"):
                mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
            mlflow.start_run(run_name=args.run_name, nested=nested)
            self._auto_end_run = True
        params = run_config(args, model)
        if os.getenv("MLFLOW_FLATTEN_PARAMS", "FALSE").upper() in _TRUE:
            params = _flatten(params)
        limit = mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
        for name in [name for name, value in params.items() if len(str(value)) > limit]:
            logger.warning("MLflow takes parameter values of at most %d characters: %r is left out.", limit, name)
            del params[name]
        items = list(params.items())
        maximum = os.getenv("MLFLOW_MAX_LOG_PARAMS", "")
        if maximum.isdigit():
            items = items[: int(maximum)]
        batch = mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
        for start in range(0, len(items), batch):
            mlflow.log_params(dict(items[start : start + batch]), synchronous=False)
        if os.getenv("MLFLOW_TAGS"):
            mlflow.set_tags(json.loads(os.environ["MLFLOW_TAGS"]))

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not self._initialized:
            self.setup(args, state, model)

    def on_log(self, args, state, control, logs, model=None, **kwargs):
        if not self._initialized:
            self.setup(args, state, model)
        if not state.is_world_process_zero:
            return
        metrics = {}
        for key, value in logs.items():
            if hasattr(value, "numel") and value.numel() == 1:
                value = value.item()
            if isinstance(value, (int, float)):
                metrics[re.sub(r"[^0-9A-Za-z_\-\.\ :/]", "_", key)] = value
            else:
                logger.warning("MLflow logs numbers only: %r (%s) is left out.", key, type(value).__name__)
        self._ml_flow.log_metrics(metrics=metrics, step=state.global_step, synchronous=False)

    def on_train_end(self, args, state, control, **kwargs):
        if self._initialized and state.is_world_process_zero and self._auto_end_run and self._ml_flow.active_run():
            self._ml_flow.end_run()


def _flatten(values: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
