"""transformers.optimization's named schedule builders (get_linear_schedule_with_warmup, ...), with its
signatures: each builds the scheduler get_scheduler builds for that name, from the same factor functions."""

from __future__ import annotations

from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from lathe.train.optim import schedules
from lathe.train.optim.adafactor import get_adafactor_schedule
from lathe.train.optim.greedy import get_greedy_schedule

__all__ = [
    "get_adafactor_schedule",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
    "get_greedy_schedule",
    "get_inverse_sqrt_schedule",
    "get_linear_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "get_reduce_on_plateau_schedule",
    "get_wsd_schedule",
]


def _lambda(name: str, optimizer, num_warmup_steps, num_training_steps, last_epoch: int, **kwargs) -> LambdaLR:
    binder, _ = schedules._BINDERS[name]
    return LambdaLR(optimizer, binder(optimizer, num_warmup_steps, num_training_steps, **kwargs), last_epoch)


def get_constant_schedule(optimizer, last_epoch: int = -1) -> LambdaLR:
    return LambdaLR(optimizer, schedules.constant_factor, last_epoch)


def get_reduce_on_plateau_schedule(optimizer, **kwargs) -> ReduceLROnPlateau:
    return ReduceLROnPlateau(optimizer, **kwargs)


def get_constant_schedule_with_warmup(optimizer, num_warmup_steps: int, last_epoch: int = -1) -> LambdaLR:
    return _lambda("constant_with_warmup", optimizer, num_warmup_steps, None, last_epoch)


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, last_epoch=-1) -> LambdaLR:
    return _lambda("linear", optimizer, num_warmup_steps, num_training_steps, last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 0.5, last_epoch: int = -1
) -> LambdaLR:
    return _lambda("cosine", optimizer, num_warmup_steps, num_training_steps, last_epoch, num_cycles=num_cycles)


def get_cosine_with_hard_restarts_schedule_with_warmup(
    optimizer, num_warmup_steps: int, num_training_steps: int, num_cycles: int = 1, last_epoch: int = -1
) -> LambdaLR:
    return _lambda(
        "cosine_with_restarts", optimizer, num_warmup_steps, num_training_steps, last_epoch, num_cycles=num_cycles
    )


def get_polynomial_decay_schedule_with_warmup(
    optimizer, num_warmup_steps, num_training_steps, lr_end=1e-7, power=1.0, last_epoch=-1
) -> LambdaLR:
    return _lambda(
        "polynomial", optimizer, num_warmup_steps, num_training_steps, last_epoch, lr_end=lr_end, power=power
    )


def get_inverse_sqrt_schedule(
    optimizer, num_warmup_steps: int, timescale: int | None = None, last_epoch: int = -1
) -> LambdaLR:
    return _lambda("inverse_sqrt", optimizer, num_warmup_steps, None, last_epoch, timescale=timescale)


def get_cosine_with_min_lr_schedule_with_warmup(
    optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
) -> LambdaLR:
    options = dict(num_cycles=num_cycles, min_lr=min_lr, min_lr_rate=min_lr_rate)
    return _lambda("cosine_with_min_lr", optimizer, num_warmup_steps, num_training_steps, last_epoch, **options)


def get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
    optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
    warmup_lr_rate: float | None = None,
) -> LambdaLR:
    options = dict(num_cycles=num_cycles, min_lr=min_lr, min_lr_rate=min_lr_rate, warmup_lr_rate=warmup_lr_rate)
    name = "cosine_warmup_with_min_lr"
    return _lambda(name, optimizer, num_warmup_steps, num_training_steps, last_epoch, **options)


def get_wsd_schedule(
    optimizer,
    num_warmup_steps: int,
    num_decay_steps: int,
    num_training_steps: int | None = None,
    num_stable_steps: int | None = None,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    options = dict(
        num_decay_steps=num_decay_steps,
        num_stable_steps=num_stable_steps,
        warmup_type=warmup_type,
        decay_type=decay_type,
        min_lr_ratio=min_lr_ratio,
        num_cycles=num_cycles,
    )
    return _lambda("warmup_stable_decay", optimizer, num_warmup_steps, num_training_steps, last_epoch, **options)
