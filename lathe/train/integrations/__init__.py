"""Reporters named by TrainingArguments.report_to; each optional package is imported lazily in its own module."""

from __future__ import annotations


def reporter_callbacks(report_to) -> list:
    """Callback classes for the names in report_to ("none" / [] means no reporter)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    callbacks = []
    for name in names:
        if name in ("none", None):
            continue
        if name == "tensorboard":
            from lathe.train.integrations.tensorboard import TensorBoardCallback

            callbacks.append(TensorBoardCallback)
        elif name == "jsonl":
            from lathe.train.integrations.jsonl import JsonlLoggerCallback

            callbacks.append(JsonlLoggerCallback)
        else:
            raise ValueError(
                f"report_to={name!r} is not supported; lathe reports to: 'tensorboard', 'jsonl', or 'none'."
            )
    return callbacks
