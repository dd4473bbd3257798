"""Adafactor (Shazeer & Stern, 2018): Adam-like updates with factored second moments, numerically as transformers'."""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _rms(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.norm(2) / (tensor.numel() ** 0.5)


def _factored_inverse_sqrt(row_mean_sq: torch.Tensor, col_mean_sq: torch.Tensor) -> torch.Tensor:
    """1/sqrt of the rank-1 estimate of E[g^2] rebuilt from its row and column means.

    E[g^2][i, j] ~ row[i] * col[j] / mean(row); the division by mean(row) is folded into the row factor.
    """
    row_factor = (row_mean_sq / row_mean_sq.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
    col_factor = col_mean_sq.unsqueeze(-2).rsqrt()
    return torch.mul(row_factor, col_factor)


class Adafactor(torch.optim.Optimizer):
    """Adafactor with the same options, defaults, state keys and numbers as `transformers.Adafactor`.

    Parameters with 2 or more dimensions keep only row and column means of the squared gradient (memory
    O(n + m) instead of O(n * m)); vectors keep a full second moment. `beta1=None` means no first moment.

    Args:
        lr: external learning rate; must be None when `relative_step` is True.
        eps: (added to squared gradients, lower bound of the parameter scale).
        clip_threshold: the update is scaled down so its RMS is at most this.
        decay_rate: the second-moment decay at step t is 1 - t**decay_rate (so it anneals towards 1).
        beta1: first-moment coefficient, or None to skip the first moment.
        weight_decay: decoupled decay, scaled by the step size.
        scale_parameter: multiply the step size by the parameter's RMS (at least eps[1]).
        relative_step: ignore `lr` and use min(1e-2, 1/sqrt(t)) as the step size.
        warmup_init: with `relative_step`, ramp the step size up as 1e-6 * t first.

    With the Trainer and an LR schedule use `scale_parameter=False, relative_step=False` (what `optim="adafactor"`
    does), so that the schedule alone sets the step size.
    """

    def __init__(
        self,
        params,
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
    ):
        if lr is not None and relative_step:
            raise ValueError("Adafactor: a manual lr cannot be combined with relative_step=True")
        if lr is None and not relative_step:
            raise ValueError("Adafactor: relative_step=False needs an lr")
        if warmup_init and not relative_step:
            raise ValueError("Adafactor: warmup_init=True requires relative_step=True")
        defaults = {
            "lr": lr,
            "eps": eps,
            "clip_threshold": clip_threshold,
            "decay_rate": decay_rate,
            "beta1": beta1,
            "weight_decay": weight_decay,
            "scale_parameter": scale_parameter,
            "relative_step": relative_step,
            "warmup_init": warmup_init,
        }
        super().__init__(params, defaults)

    @staticmethod
    def _step_size(group: dict, state: dict) -> float:
        """The effective learning rate for one parameter at its current step."""
        step_size = group["lr"]
        if group["relative_step"]:
            ceiling = 1e-6 * state["step"] if group["warmup_init"] else 1e-2
            step_size = min(ceiling, 1.0 / math.sqrt(state["step"]))
        if group["scale_parameter"]:
            # Relative to the parameter's own magnitude; eps[1] keeps zero-initialised parameters moving.
            step_size = max(group["eps"][1], state["RMS"]) * step_size
        return step_size

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _init_or_move_state(self, state: dict, grad: torch.Tensor, factored: bool, use_first_moment: bool) -> None:
        if not state:
            state["step"] = 0
            state["RMS"] = 0
            if use_first_moment:
                state["exp_avg"] = torch.zeros_like(grad)
            if factored:
                state["exp_avg_sq_row"] = torch.zeros(grad.shape[:-1]).to(grad)
                state["exp_avg_sq_col"] = torch.zeros(grad.shape[:-2] + grad.shape[-1:]).to(grad)
            else:
                state["exp_avg_sq"] = torch.zeros_like(grad)
            return
        # load_state_dict casts state to the parameter's dtype; for fp16/bf16 parameters bring it back to fp32.
        for key in ("exp_avg", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"):
            if key in state:
                state[key] = state[key].to(grad)

    def _update(self, param: torch.Tensor, group: dict) -> None:
        grad = param.grad
        if grad.is_sparse:
            raise RuntimeError("Adafactor does not support sparse gradients")
        # Low-precision parameters are updated in an fp32 copy and written back once at the end.
        if grad.dtype in _LOW_PRECISION:
            grad = grad.float()
        work = param.float() if param.dtype in _LOW_PRECISION else param

        factored = grad.dim() >= 2
        use_first_moment = group["beta1"] is not None
        state = self.state[param]
        self._init_or_move_state(state, grad, factored, use_first_moment)

        state["step"] += 1
        state["RMS"] = _rms(work)
        step_size = self._step_size(group, state)

        # Second-moment decay 1 - t^decay_rate: 0 at t=1 (plain g^2), approaching 1 as t grows.
        beta2 = 1.0 - math.pow(state["step"], group["decay_rate"])
        squared = grad**2 + group["eps"][0]
        if factored:
            row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
            row.mul_(beta2).add_(squared.mean(dim=-1), alpha=1.0 - beta2)
            col.mul_(beta2).add_(squared.mean(dim=-2), alpha=1.0 - beta2)
            update = _factored_inverse_sqrt(row, col).mul_(grad)
        else:
            second_moment = state["exp_avg_sq"]
            second_moment.mul_(beta2).add_(squared, alpha=1.0 - beta2)
            update = second_moment.rsqrt().mul_(grad)

        # Update clipping replaces Adam's bias correction as the guard against huge early steps.
        update.div_((_rms(update) / group["clip_threshold"]).clamp_(min=1.0))
        update.mul_(step_size)

        if use_first_moment:
            exp_avg = state["exp_avg"]
            exp_avg.mul_(group["beta1"]).add_(update, alpha=1.0 - group["beta1"])
            update = exp_avg

        if group["weight_decay"] != 0:
            work.add_(work, alpha=-group["weight_decay"] * step_size)
        work.add_(-update)
        if param.dtype in _LOW_PRECISION:
            param.copy_(work)


class AdafactorSchedule(LambdaLR):
    """A stand-in schedule for an Adafactor that sets its own step size (relative_step): the Trainer needs a
    scheduler, and logs its learning rate. Before the first update it reports `initial_lr`; afterwards, the
    step size Adafactor used for each group's first parameter (written into the group's "lr")."""

    def __init__(self, optimizer, initial_lr: float = 0.0):
        for group in optimizer.param_groups:  # LambdaLR takes its base rates from here
            group["initial_lr"] = initial_lr
        super().__init__(optimizer, partial(_constant, value=initial_lr))
        for group in optimizer.param_groups:
            del group["initial_lr"]

    def get_lr(self):
        optimizer = self.optimizer
        # lathe's Adafactor names it _step_size; transformers' _get_lr (so either optimizer works here)
        step_size = getattr(optimizer, "_step_size", None) or optimizer._get_lr
        rates = [
            step_size(group, optimizer.state[group["params"][0]])
            for group in optimizer.param_groups
            if group["params"] and group["params"][0].grad is not None
        ]
        return rates or self.base_lrs  # before the first update


def _constant(step: int, *, value: float) -> float:
    return value


def get_adafactor_schedule(optimizer, initial_lr: float = 0.0) -> AdafactorSchedule:
    return AdafactorSchedule(optimizer, initial_lr)
