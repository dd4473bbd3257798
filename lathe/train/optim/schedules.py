"""Learning-rate schedules: pure per-step multiplier functions, and `get_scheduler` that binds one to an optimizer."""

from __future__ import annotations

import inspect
import math
import warnings
from functools import partial
from typing import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from lathe.train.optim.greedy import GreedyLR
from lathe.train.optim.layerwise import LayerwiseScheduler, is_layerwise

# Every `*_factor` function below maps the scheduler's step counter to a multiplier of the optimizer's base LR.
# They are module-level and bound with functools.partial rather than closures, so that LambdaLR can put their
# arguments in its state_dict and the scheduler pickles (both needed for checkpoints and multiprocessing).
# `current_step` is LambdaLR's `last_epoch`: 0 before the first optimizer step, k after k steps.


def _warmup_factor(current_step: int, num_warmup_steps: int) -> float:
    # max(1, ...) keeps num_warmup_steps == 0 from dividing by zero; that branch is never taken then anyway.
    return float(current_step) / float(max(1, num_warmup_steps))


def _decay_progress(current_step: int, num_warmup_steps: int, num_training_steps: int) -> float:
    """Fraction of the post-warmup phase done: 0.0 at the end of warmup, 1.0 at `num_training_steps`."""
    return float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))


def constant_factor(current_step: int) -> float:
    return 1.0


def constant_with_warmup_factor(current_step: int, *, num_warmup_steps: int) -> float:
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    return 1.0


def linear_factor(current_step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    remaining = float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, remaining)  # stays at 0 if the loop runs past num_training_steps


def cosine_factor(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    min_lr_rate: float = 0.0,
) -> float:
    """Cosine from 1 down to `min_lr_rate`; num_cycles=0.5 is one half-wave. Serves cosine and cosine_with_min_lr."""
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    progress = _decay_progress(current_step, num_warmup_steps, num_training_steps)
    wave = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return max(0.0, wave * (1.0 - min_lr_rate) + min_lr_rate)


def cosine_with_restarts_factor(
    current_step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int = 1
) -> float:
    """`num_cycles` half-cosines from 1 to 0, each jumping back to 1 (a hard restart)."""
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    progress = _decay_progress(current_step, num_warmup_steps, num_training_steps)
    if progress >= 1.0:
        return 0.0
    position_in_cycle = (float(num_cycles) * progress) % 1.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * position_in_cycle)))


def polynomial_factor(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float,
    power: float,
    lr_init: float,
) -> float:
    """Polynomial decay from `lr_init` to the absolute LR `lr_end` (BERT/fairseq style; power=1 is linear)."""
    # The schedule is defined on absolute LRs, but LambdaLR multiplies by the base LR: hence the `/ lr_init`.
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    if current_step > num_training_steps:
        return lr_end / lr_init
    decay_steps = max(1, num_training_steps - num_warmup_steps)
    fraction_remaining = 1.0 - (current_step - num_warmup_steps) / decay_steps
    return ((lr_init - lr_end) * fraction_remaining**power + lr_end) / lr_init


def inverse_sqrt_factor(current_step: int, *, num_warmup_steps: int, timescale: int) -> float:
    """1/sqrt decay after warmup (big_vision style), continuous at the end of warmup: 1.0 there."""
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((current_step + shift) / timescale)


def cosine_warmup_with_min_lr_factor(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    min_lr_rate: float = 0.0,
    warmup_lr_rate: float | None = None,
) -> float:
    """Like cosine_factor with a min LR, but warmup never yields 0 and the decay is shifted one step earlier."""
    # The +1 shifts mean the very first optimizer step already uses a non-zero LR (1/num_warmup_steps of the
    # base, or `warmup_lr_rate`), instead of wasting step 0 on LR = 0 as the other warmups do.
    step, warmup, total = float(current_step), float(num_warmup_steps), float(num_training_steps)
    if step < warmup:
        if warmup_lr_rate is None:
            return (step + 1.0) / max(1.0, warmup)
        start = float(warmup_lr_rate)
        return start + (1.0 - start) * step / max(1.0, warmup - 1.0)
    progress = (step - warmup + 1.0) / max(1.0, total - warmup)
    wave = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
    return max(0.0, wave * (1.0 - min_lr_rate) + min_lr_rate)


_SHAPES = ("linear", "cosine", "1-sqrt")


def _rising(shape: str, progress: float) -> float:
    """0 -> 1 as progress goes 0 -> 1."""
    if shape == "linear":
        return progress
    if shape == "cosine":
        return 0.5 * (1.0 - math.cos(math.pi * progress))
    return 1.0 - math.sqrt(1.0 - progress)  # "1-sqrt"


def _falling(shape: str, progress: float, num_cycles: float) -> float:
    """1 -> 0 as progress goes 0 -> 1 (for cosine, with num_cycles=0.5)."""
    if shape == "linear":
        return 1.0 - progress
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return 1.0 - math.sqrt(progress)  # "1-sqrt"


def warmup_stable_decay_factor(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_stable_steps: int,
    num_decay_steps: int,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> float:
    """Warmup from `min_lr_ratio` to 1, hold at 1, decay back to `min_lr_ratio`, then stay there."""
    if current_step < num_warmup_steps:
        shape = _rising(warmup_type, _warmup_factor(current_step, num_warmup_steps))
        return max(0.0, shape * (1.0 - min_lr_ratio) + min_lr_ratio)
    decay_start = num_warmup_steps + num_stable_steps
    if current_step < decay_start:
        return 1.0
    if current_step < decay_start + num_decay_steps:
        progress = float(current_step - decay_start) / float(max(1, num_decay_steps))
        shape = _falling(decay_type, progress, num_cycles)
        return max(0.0, shape * (1.0 - min_lr_ratio) + min_lr_ratio)
    return min_lr_ratio


# --- binding: turn get_scheduler's arguments into one partial multiplier, validating them on the way ---------


def _min_lr_rate(name: str, optimizer: torch.optim.Optimizer, min_lr: float | None, min_lr_rate: float | None):
    if min_lr is not None and min_lr_rate is not None:
        raise ValueError(f"{name}: set only one of min_lr or min_lr_rate")
    if min_lr is not None:
        return min_lr / optimizer.defaults["lr"]
    if min_lr_rate is None:
        raise ValueError(f"{name} requires min_lr or min_lr_rate (pass it in lr_scheduler_kwargs)")
    return min_lr_rate


def _bind_constant_with_warmup(optimizer, num_warmup_steps, num_training_steps, **ignored):
    # Like transformers, constant schedules ignore scheduler_specific_kwargs rather than rejecting them.
    return partial(constant_with_warmup_factor, num_warmup_steps=num_warmup_steps)


def _bind_linear(optimizer, num_warmup_steps, num_training_steps):
    return partial(linear_factor, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps)


def _bind_cosine(optimizer, num_warmup_steps, num_training_steps, *, num_cycles=0.5):
    return partial(
        cosine_factor, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, num_cycles=num_cycles
    )


def _bind_cosine_with_restarts(optimizer, num_warmup_steps, num_training_steps, *, num_cycles=1):
    return partial(
        cosine_with_restarts_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )


def _bind_polynomial(optimizer, num_warmup_steps, num_training_steps, *, lr_end=1e-7, power=1.0):
    lr_init = optimizer.defaults["lr"]
    if not lr_init > lr_end:
        raise ValueError(f"polynomial: lr_end ({lr_end}) must be smaller than the initial lr ({lr_init})")
    return partial(
        polynomial_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        lr_end=lr_end,
        power=power,
        lr_init=lr_init,
    )


def _bind_inverse_sqrt(optimizer, num_warmup_steps, num_training_steps, *, timescale=None):
    if timescale is None:
        timescale = num_warmup_steps or 10_000
    return partial(inverse_sqrt_factor, num_warmup_steps=num_warmup_steps, timescale=timescale)


def _bind_cosine_with_min_lr(
    optimizer, num_warmup_steps, num_training_steps, *, num_cycles=0.5, min_lr=None, min_lr_rate=None
):
    return partial(
        cosine_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=_min_lr_rate("cosine_with_min_lr", optimizer, min_lr, min_lr_rate),
    )


def _bind_cosine_warmup_with_min_lr(
    optimizer,
    num_warmup_steps,
    num_training_steps,
    *,
    num_cycles=0.5,
    min_lr=None,
    min_lr_rate=None,
    warmup_lr_rate=None,
):
    return partial(
        cosine_warmup_with_min_lr_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=_min_lr_rate("cosine_warmup_with_min_lr", optimizer, min_lr, min_lr_rate),
        warmup_lr_rate=warmup_lr_rate,
    )


def _bind_warmup_stable_decay(
    optimizer,
    num_warmup_steps,
    num_training_steps,
    *,
    num_decay_steps=None,
    num_stable_steps=None,
    warmup_type="linear",
    decay_type="cosine",
    min_lr_ratio=0.0,
    num_cycles=0.5,
):
    if num_decay_steps is None:
        raise ValueError("warmup_stable_decay requires num_decay_steps (pass it in lr_scheduler_kwargs)")
    if num_training_steps is None and num_stable_steps is None:
        raise ValueError("warmup_stable_decay requires num_training_steps or num_stable_steps")
    if num_training_steps is not None and num_stable_steps is not None:
        warnings.warn("warmup_stable_decay got both num_training_steps and num_stable_steps; using num_stable_steps")
    for kind, shape in (("warmup_type", warmup_type), ("decay_type", decay_type)):
        if shape not in _SHAPES:
            raise ValueError(f"warmup_stable_decay: unknown {kind} {shape!r}, expected one of {list(_SHAPES)}")
    if num_stable_steps is None:
        num_stable_steps = num_training_steps - num_warmup_steps - num_decay_steps
    return partial(
        warmup_stable_decay_factor,
        num_warmup_steps=num_warmup_steps,
        num_stable_steps=num_stable_steps,
        num_decay_steps=num_decay_steps,
        warmup_type=warmup_type,
        decay_type=decay_type,
        min_lr_ratio=min_lr_ratio,
        num_cycles=num_cycles,
    )


# name -> (binder, needs num_training_steps). Every binder needs num_warmup_steps.
_BINDERS: dict[str, tuple[Callable, bool]] = {
    "linear": (_bind_linear, True),
    "cosine": (_bind_cosine, True),
    "cosine_with_restarts": (_bind_cosine_with_restarts, True),
    "polynomial": (_bind_polynomial, True),
    "constant_with_warmup": (_bind_constant_with_warmup, False),
    "inverse_sqrt": (_bind_inverse_sqrt, False),
    "cosine_with_min_lr": (_bind_cosine_with_min_lr, True),
    "cosine_warmup_with_min_lr": (_bind_cosine_warmup_with_min_lr, True),
    "warmup_stable_decay": (_bind_warmup_stable_decay, False),  # it can use num_stable_steps instead
}

SCHEDULER_NAMES = ("constant", "reduce_lr_on_plateau", "greedy", *_BINDERS)


def steps_on_metric(scheduler) -> bool:
    """ReduceLROnPlateau and GreedyLR step with the evaluation metric (Trainer._evaluate), not at every update."""
    return isinstance(scheduler, (ReduceLROnPlateau, GreedyLR))


def get_scheduler(
    name,
    optimizer: torch.optim.Optimizer,
    num_warmup_steps: int | None = None,
    num_training_steps: int | None = None,
    scheduler_specific_kwargs: dict | None = None,
):
    """Build the LR scheduler called `name` (a str or str-enum such as SchedulerType) for `optimizer`.

    Same signature and numbers as transformers.get_scheduler. Every schedule is a LambdaLR over one of the
    `*_factor` functions, except reduce_lr_on_plateau (torch's ReduceLROnPlateau) and greedy (GreedyLR), built
    from `scheduler_specific_kwargs` and stepped with a metric.
    """
    name = getattr(name, "value", name)  # accept SchedulerType members as well as plain strings
    if name not in SCHEDULER_NAMES:
        raise ValueError(f"unsupported lr scheduler {name!r}; valid names are {list(SCHEDULER_NAMES)}")
    if is_layerwise(optimizer):  # one schedule per parameter optimizer, stepped by hooks as they are
        return LayerwiseScheduler(
            optimizer,
            lambda inner: get_scheduler(name, inner, num_warmup_steps, num_training_steps, scheduler_specific_kwargs),
        )
    kwargs = dict(scheduler_specific_kwargs or {})

    if name == "constant":
        return LambdaLR(optimizer, constant_factor)
    if name == "reduce_lr_on_plateau":
        return ReduceLROnPlateau(optimizer, **kwargs)
    if name == "greedy":
        return GreedyLR(optimizer, **kwargs)

    binder, needs_training_steps = _BINDERS[name]
    if num_warmup_steps is None:
        raise ValueError(f"{name} requires num_warmup_steps")
    if needs_training_steps and num_training_steps is None:
        raise ValueError(f"{name} requires num_training_steps")
    _check_options(name, binder, kwargs)
    return LambdaLR(optimizer, binder(optimizer, num_warmup_steps, num_training_steps, **kwargs))


def _check_options(name: str, binder: Callable, kwargs: dict) -> None:
    """Reject unknown scheduler_specific_kwargs naming the schedule (TypeError, as transformers raises)."""
    parameters = inspect.signature(binder).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    accepted = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unexpected = sorted(set(kwargs) - set(accepted))
    if unexpected:
        raise TypeError(f"{name} does not accept scheduler_specific_kwargs {unexpected}; it accepts {accepted}")
