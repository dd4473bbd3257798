"""Muon with an AdamW fallback, as LLaMA-Factory 0.9.5's `use_muon` runs it (Moonlight's variant of Muon).

Matrices get SGD momentum whose update is orthogonalised by a quintic Newton-Schulz iteration (in
bfloat16) and scaled by 0.2 * sqrt(max(rows, cols)), so its RMS matches a typical AdamW update; every
other parameter (vectors, and the matrices the caller sends to `adamw_params`: embeddings, the output
head) gets AdamW. One weight decay applies to both, decoupled as lr * wd.

torch.optim.Muon is not the same arithmetic (its momentum buffer is an exponential average, `lerp`,
where this one sums, `buf = momentum * buf + grad`; it fuses the iteration with addmm), so its numbers
differ from LLaMA-Factory's; this module states LLaMA-Factory's algorithm.
"""

from __future__ import annotations

import math

import torch

__all__ = ["Muon", "orthogonalise"]

# Coefficients of the quintic iteration X <- aX + b(XX^T)X + c(XX^T)^2 X, chosen (Keller Jordan) for the
# steepest slope at 0: it pushes every singular value towards ~1 in few steps without converging exactly.
_NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)


def orthogonalise(gradient: torch.Tensor, steps: int) -> torch.Tensor:
    """An approximately orthogonal matrix with the singular vectors of `gradient` (2-D), in bfloat16."""
    a, b, c = _NEWTON_SCHULZ
    wide = gradient.size(0) > gradient.size(1)
    x = gradient.bfloat16()
    if wide:
        x = x.T  # iterate on the side with fewer rows: the Gram matrix is the smaller one
    x = x / (x.norm() + 1e-7)  # spectral norm <= Frobenius norm <= 1, inside the iteration's basin
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if wide else x


class Muon(torch.optim.Optimizer):
    """Muon for `muon_params` (2-D), AdamW for `adamw_params`.

    Args:
        lr: learning rate of both (Muon's is scaled per matrix, see the module docstring).
        wd: decoupled weight decay of both: p *= 1 - lr * wd before each update.
        momentum, nesterov, ns_steps: Muon's momentum, Nesterov look-ahead, Newton-Schulz steps.
        adamw_betas, adamw_eps: AdamW's; its eps is added to sqrt(v) before bias correction.
    """

    def __init__(
        self,
        lr=1e-3,
        wd=0.1,
        muon_params=None,
        momentum=0.95,
        nesterov=True,
        ns_steps=5,
        adamw_params=None,
        adamw_betas=(0.9, 0.95),
        adamw_eps=1e-8,
    ):
        muon_params = list(muon_params or [])
        adamw_params = list(adamw_params or [])
        defaults = {
            "lr": lr,
            "wd": wd,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "adamw_betas": adamw_betas,
            "adamw_eps": adamw_eps,
        }
        super().__init__(muon_params + adamw_params, defaults)
        for parameter in muon_params:
            if parameter.ndim != 2:
                raise ValueError(f"Muon updates matrices; got a parameter of shape {tuple(parameter.shape)}")
            self.state[parameter]["use_muon"] = True
        for parameter in adamw_params:
            self.state[parameter]["use_muon"] = False

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                if self.state[parameter]["use_muon"]:
                    self._muon_update(parameter, group)
                else:
                    self._adamw_update(parameter, group)
        return loss

    def _muon_update(self, parameter: torch.Tensor, group: dict) -> None:
        gradient = parameter.grad
        state = self.state[parameter]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(gradient)
        buffer = state["momentum_buffer"]
        buffer.mul_(group["momentum"]).add_(gradient)
        direction = gradient.add(buffer, alpha=group["momentum"]) if group["nesterov"] else buffer
        update = orthogonalise(direction, group["ns_steps"])
        rows, cols = parameter.shape[:2]
        scaled_lr = group["lr"] * 0.2 * math.sqrt(max(rows, cols))
        parameter.mul_(1 - group["lr"] * group["wd"])
        parameter.add_(update, alpha=-scaled_lr)

    def _adamw_update(self, parameter: torch.Tensor, group: dict) -> None:
        gradient = parameter.grad
        state = self.state[parameter]
        if "step" not in state:
            state["step"] = 0
            state["moment1"] = torch.zeros_like(gradient)
            state["moment2"] = torch.zeros_like(gradient)
        state["step"] += 1
        beta1, beta2 = group["adamw_betas"]
        state["moment1"].lerp_(gradient, 1 - beta1)
        state["moment2"].lerp_(gradient.square(), 1 - beta2)
        direction = state["moment1"] / (group["adamw_eps"] + state["moment2"].sqrt())
        # lr * sqrt(1 - beta2^t) / (1 - beta1^t): Adam's bias corrections folded into the step size.
        scale = (1 - beta1 ** state["step"]) / (1 - beta2 ** state["step"]) ** 0.5
        parameter.mul_(1 - group["lr"] * group["wd"])
        parameter.add_(direction, alpha=-group["lr"] / scale)
