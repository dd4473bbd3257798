"""Layer-wise optimizers: one optimizer per parameter, stepped the moment that parameter's gradient is complete.

GaLore and APOLLO's layer-wise variants (`optim=galore_adamw_layerwise`, LLaMA-Factory's `galore_layerwise`)
free each gradient inside the backward pass instead of holding all of them until the step, which is where
their memory saving comes from. As in transformers and LLaMA-Factory, a post-accumulate-grad hook on every
trainable parameter steps that parameter's optimizer and zeroes its gradient, and a second hook steps its
learning-rate schedule; the Trainer sees a `LayerwiseOptimizer` whose step() and zero_grad() do nothing, and
a `LayerwiseScheduler` that reports the learning rate the parameters used. Consequences users see (the
peers' too): the logged grad_norm is 0 and clipping has nothing to clip (the gradients are gone by then),
gradient accumulation is impossible, and so are several processes (DDP reduces gradients after the hooks).

Unlike transformers' dummy optimizer, the state of every per-parameter optimizer and schedule goes into
state_dict(), so a checkpoint resumes the run exactly.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["LayerwiseOptimizer", "LayerwiseScheduler", "PerParameter", "build_layerwise_optimizer", "is_layerwise"]


class LayerwiseOptimizer(torch.optim.Optimizer):
    """What the Trainer holds for a layer-wise optimizer: the per-parameter optimizers, stepped by hooks.

    Its one param group (a placeholder tensor) carries the base learning rate, so that schedulers and
    callbacks that read `optimizer.param_groups` keep working.
    """

    def __init__(self, optimizers: dict[torch.nn.Parameter, torch.optim.Optimizer], lr: float):
        self.optimizer_dict = optimizers
        self.hook_handles: list = []
        super().__init__([torch.zeros(1, 1)], {"lr": lr})

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # each hook zeroes its own parameter's gradient right after stepping it

    def step(self, closure=None):
        return None  # every parameter was already stepped during the backward pass

    def state_dict(self) -> dict:
        return {"layerwise": [optimizer.state_dict() for optimizer in self.optimizer_dict.values()]}

    def load_state_dict(self, state_dict: dict) -> None:
        states = state_dict.get("layerwise")
        if states is None or len(states) != len(self.optimizer_dict):
            raise ValueError(
                f"this checkpoint's optimizer state does not come from a layer-wise optimizer over "
                f"{len(self.optimizer_dict)} parameters; resume with the optim (and trainable parameters) it was saved with."
            )
        for optimizer, state in zip(self.optimizer_dict.values(), states):
            optimizer.load_state_dict(state)


def build_layerwise_optimizer(
    optimizers: dict[torch.nn.Parameter, torch.optim.Optimizer], lr: float
) -> LayerwiseOptimizer:
    """Register the stepping hooks on every parameter of `optimizers` (one single-parameter optimizer each)."""
    layerwise = LayerwiseOptimizer(optimizers, lr)

    def step_parameter(parameter: torch.nn.Parameter) -> None:
        if parameter.grad is not None:
            optimizers[parameter].step()
            optimizers[parameter].zero_grad()

    layerwise.hook_handles = [parameter.register_post_accumulate_grad_hook(step_parameter) for parameter in optimizers]
    return layerwise


class PerParameter:
    """Stands where an optimizer class goes (`optimizer_cls(param_groups, **kwargs)`) and builds a
    LayerwiseOptimizer instead: one `optimizer_cls` per trainable parameter, with its group's options."""

    def __init__(self, optimizer_cls):
        self.optimizer_cls = optimizer_cls

    def __call__(self, param_groups: list[dict], **kwargs) -> LayerwiseOptimizer:
        optimizers = {}
        for group in param_groups:
            options = {key: value for key, value in group.items() if key != "params"}
            for parameter in group["params"]:
                if parameter.requires_grad:
                    optimizers[parameter] = self.optimizer_cls([{"params": [parameter], **options}], **kwargs)
        return build_layerwise_optimizer(optimizers, kwargs.get("lr", 1e-3))


def is_layerwise(optimizer) -> bool:
    return isinstance(optimizer, LayerwiseOptimizer)


class LayerwiseScheduler(LRScheduler):
    """One schedule per parameter, stepped by a hook right after that parameter's optimizer (so the next
    step uses the next rate); the Trainer's own step() only records the rate the parameters use now."""

    def __init__(self, optimizer: LayerwiseOptimizer, make_schedule):
        self.schedulers = {parameter: make_schedule(inner) for parameter, inner in optimizer.optimizer_dict.items()}

        def step_schedule(parameter: torch.nn.Parameter) -> None:
            self.schedulers[parameter].step()

        # Registered after the optimizer's hooks, so they run after them (torch runs hooks in order).
        self.hook_handles = [
            parameter.register_post_accumulate_grad_hook(step_schedule) for parameter in self.schedulers
        ]
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        first = next(iter(self.optimizer.optimizer_dict.values()), None)
        return [first.param_groups[0]["lr"] if first is not None else self.base_lrs[0]]

    def state_dict(self) -> dict:
        state = {
            key: value for key, value in self.__dict__.items() if key not in ("optimizer", "schedulers", "hook_handles")
        }
        state["layerwise"] = [scheduler.state_dict() for scheduler in self.schedulers.values()]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        inner = state.pop("layerwise", None)
        if inner is None or len(inner) != len(self.schedulers):
            raise ValueError("this checkpoint's scheduler state does not come from the same layer-wise optimizer.")
        self.__dict__.update(state)
        for scheduler, scheduler_state in zip(self.schedulers.values(), inner):
            scheduler.load_state_dict(scheduler_state)
