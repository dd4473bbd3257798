"""GreedyLR (lr_scheduler_type="greedy"): a learning rate that follows the evaluation metric, up after
`patience` improving evaluations, down after `patience` stale ones; and its StreamingAverage smoothing."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GreedyLR", "StreamingAverage", "get_greedy_schedule"]


class StreamingAverage:
    """The mean of the last `window_size` values."""

    def __init__(self, window_size: int) -> None:
        self.window_size = window_size
        self.values: list[float] = []
        self.sum = 0.0

    def streamavg(self, value: float) -> float:
        """Add `value`; return the mean of the window."""
        self.values.append(value)
        self.sum += value
        if len(self.values) > self.window_size:
            self.sum -= self.values.pop(0)
        return self.sum / len(self.values)

    def state_dict(self) -> dict[str, Any]:
        return {"window_size": self.window_size, "values": list(self.values), "sum": self.sum}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.window_size = state_dict.get("window_size", self.window_size)
        self.values = list(state_dict.get("values", []))
        self.sum = state_dict.get("sum", 0.0)


def _per_group(value, optimizer, name: str) -> list[float]:
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(
                f"GreedyLR: expected {len(optimizer.param_groups)} {name}s (one per group), got {len(value)}"
            )
        return list(value)
    return [value] * len(optimizer.param_groups)


# The scheduler's settings and counters: the keys of its state_dict, the same as transformers' GreedyLR,
# so that scheduler.pt crosses between the two libraries.
_STATE_KEYS = (
    "factor", "min_lrs", "max_lrs", "patience", "verbose", "cooldown", "warmup", "cooldown_counter",
    "warmup_counter", "mode", "threshold", "threshold_mode", "best", "num_bad_epochs", "num_good_epochs", "eps",
    "last_epoch", "smooth", "window_size", "reset_start", "reset_start_original", "_last_lr", "_init_lrs",
)  # fmt: skip


class GreedyLR:
    """Stepped with a metric (`step(metric)`), as the Trainer does after each evaluation.

    More than `patience` better results in a row (better by `threshold`, "abs" or "rel", in the direction of
    `mode`) divide each group's lr by `factor` (up to `max_lr`), then `warmup` evaluations pass without
    change; more than `patience` results without improvement multiply it by `factor` (down to `min_lr`),
    then `cooldown` evaluations pass. Changes smaller than `eps` are not made. After `reset_start` reductions
    with every group at its floor, the lrs and counters start over. `smooth` averages the metric over
    `window_size` evaluations first.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        mode: str = "min",
        factor: float = 0.95,
        patience: int = 10,
        threshold: float = 1e-6,
        threshold_mode: str = "abs",
        cooldown: int = 0,
        warmup: int = 0,
        min_lr: float | list[float] = 1e-3,
        max_lr: float | list[float] = 1.0,
        eps: float = 1e-8,
        verbose: bool = False,
        smooth: bool = False,
        window_size: int = 50,
        reset_start: int = 500,
    ) -> None:
        if factor >= 1.0:
            raise ValueError(f"GreedyLR: factor must be < 1.0, got {factor}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"GreedyLR needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if mode not in ("min", "max"):
            raise ValueError(f"GreedyLR: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"GreedyLR: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        self.optimizer = optimizer
        self.factor, self.patience, self.verbose, self.eps = factor, patience, verbose, eps
        self.cooldown, self.warmup, self.cooldown_counter, self.warmup_counter = cooldown, warmup, 0, 0
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode
        self.smooth, self.window_size = smooth, window_size
        self.reset_start = self.reset_start_original = reset_start
        self.last_epoch = 0
        self.min_lrs = _per_group(min_lr, optimizer, "min_lr")
        self.max_lrs = _per_group(max_lr, optimizer, "max_lr")
        self._init_lrs = [group["lr"] for group in optimizer.param_groups]
        self._last_lr = list(self._init_lrs)
        self.best = float("inf") if mode == "min" else float("-inf")
        self.num_bad_epochs = self.num_good_epochs = 0
        self._streaming_avg = StreamingAverage(window_size) if smooth else None

    def step(self, metrics: float, epoch: int | None = None) -> None:
        current = float(metrics)
        if self._streaming_avg is not None:
            current = self._streaming_avg.streamavg(current)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self.cooldown_counter > 0 or self.warmup_counter > 0:  # resting after a change: count nothing
            if self.cooldown_counter > 0:
                self.cooldown_counter -= 1
            else:
                self.warmup_counter -= 1
            self.num_bad_epochs = self.num_good_epochs = 0
        else:
            self._count(current)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _count(self, current: float) -> None:
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs, self.num_good_epochs = current, 0, self.num_good_epochs + 1
        else:
            self.num_bad_epochs, self.num_good_epochs = self.num_bad_epochs + 1, 0
        if self.num_good_epochs > self.patience:
            self._increase_lr(self.last_epoch)
            self.warmup_counter, self.num_good_epochs = self.warmup, 0
        elif self.num_bad_epochs > self.patience:
            self._reduce_lr(self.last_epoch)
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0

    def is_better(self, current: float, best: float) -> bool:
        if self.mode == "min":
            return current < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return current > (best * (1.0 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold)

    def _reduce_lr(self, epoch: int) -> None:
        at_floor = True
        for index, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[index])
            if old - new > self.eps:
                group["lr"] = new
                self._say(f"Epoch {epoch}: reducing learning rate of group {index} to {new:.4e}.")
            at_floor = at_floor and group["lr"] <= self.min_lrs[index]
        if at_floor:
            self.reset_start -= 1
            if self.reset_start <= 0:
                self._reset()

    def _increase_lr(self, epoch: int) -> None:
        for index, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = min(old / self.factor, self.max_lrs[index])
            if new - old > self.eps:
                group["lr"] = new
                self._say(f"Epoch {epoch}: increasing learning rate of group {index} to {new:.4e}.")
        self.reset_start = self.reset_start_original

    def _reset(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self._init_lrs):
            group["lr"] = lr
        self.best = float("inf") if self.mode == "min" else float("-inf")
        self.num_bad_epochs = self.num_good_epochs = self.cooldown_counter = self.warmup_counter = 0
        self.reset_start = self.reset_start_original
        if self.smooth:
            self._streaming_avg = StreamingAverage(self.window_size)
        self._say("Scheduler reset to initial state.")

    def _say(self, message: str) -> None:
        if self.verbose:
            print(message)

    def get_last_lr(self) -> list[float]:
        return self._last_lr

    def state_dict(self) -> dict[str, Any]:
        state = {key: getattr(self, key) for key in _STATE_KEYS}
        if self._streaming_avg is not None:
            state["_streaming_avg"] = self._streaming_avg.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in _STATE_KEYS:
            setattr(self, key, state_dict.get(key, getattr(self, key)))
        if "_streaming_avg" in state_dict:
            self._streaming_avg = self._streaming_avg or StreamingAverage(self.window_size)
            self._streaming_avg.load_state_dict(state_dict["_streaming_avg"])
        if "_last_lr" in state_dict:  # the optimizer's lrs are the scheduler's state
            for group, lr in zip(self.optimizer.param_groups, self._last_lr):
                group["lr"] = lr


def get_greedy_schedule(optimizer: torch.optim.Optimizer, **kwargs) -> GreedyLR:
    """GreedyLR(optimizer, **kwargs): what get_scheduler("greedy", ...) builds from scheduler_specific_kwargs."""
    return GreedyLR(optimizer, **kwargs)
