"""The small value types that Trainer methods return: EvalPrediction, TrainOutput, EvalLoopOutput, PredictionOutput."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class EvalPrediction:
    """What `compute_metrics` receives: predictions and label_ids (numpy, padded with -100 across batches).

    Like transformers, it also unpacks as a tuple: `preds, labels = eval_pred`; `inputs` and `losses`
    join the tuple only when requested through `include_for_metrics`.
    """

    def __init__(self, predictions, label_ids, inputs=None, losses=None):
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses
        self.elements = (predictions, label_ids)
        if inputs is not None:
            self.elements += (inputs,)
        if losses is not None:
            self.elements += (losses,)

    def __iter__(self):
        return iter(self.elements)

    def __getitem__(self, index):
        if index >= len(self.elements):
            raise IndexError("EvalPrediction index out of range")
        return self.elements[index]

    def __len__(self):
        return len(self.elements)


class TrainOutput(NamedTuple):
    global_step: int
    training_loss: float
    metrics: dict[str, float]


class EvalLoopOutput(NamedTuple):
    predictions: np.ndarray | tuple[np.ndarray, ...] | None
    label_ids: np.ndarray | tuple[np.ndarray, ...] | None
    metrics: dict[str, float] | None
    num_samples: int | None


class PredictionOutput(NamedTuple):
    predictions: np.ndarray | tuple[np.ndarray, ...]
    label_ids: np.ndarray | tuple[np.ndarray, ...] | None
    metrics: dict[str, float] | None


def denumpify_detensorize(metrics: Any) -> Any:
    """Turn numpy scalars and 0-d tensors inside metrics into plain Python numbers (JSON-safe logs)."""
    if isinstance(metrics, (list, tuple)):
        return type(metrics)(denumpify_detensorize(m) for m in metrics)
    if isinstance(metrics, dict):
        return type(metrics)({k: denumpify_detensorize(v) for k, v in metrics.items()})
    if isinstance(metrics, np.generic):
        return metrics.item()
    if hasattr(metrics, "numel") and hasattr(metrics, "item") and metrics.numel() == 1:
        return metrics.item()
    return metrics
