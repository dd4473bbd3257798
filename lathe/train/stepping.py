"""The back-end seam of one update: how a back-end syncs, backpropagates, clips, steps and zeroes.

Trainer._update_step (trainer.py) is the update itself, the same for every back-end; it calls these
methods in this order, which is the order of this file:

    gradient_sync, backward       once per micro-batch (training_step calls backward)
    clip_gradients                once per update, before on_pre_optimizer_step
    optimizer_step                between on_pre_optimizer_step and on_optimizer_step
    scheduler_step, zero_grad     after on_optimizer_step

The back-end is chosen once per run (choose_backend), like accelerate's Accelerator.backward hides
its back-ends, so the loop never branches on fp16 scaling, DeepSpeed, DDP or FSDP2:
- PlainBackend: autograd and the optimizer as they are. DDP and FSDP2 need nothing more here: they
  wrap the model and reduce gradients inside backward, on the micro-batches gradient_sync lets through.
- GradScalerBackend: fp16 autocast, whose small gradients would underflow to zero without loss scaling.
- DeepSpeedBackend: DeepSpeed's engine, which owns backward, clipping, the step, the scheduler and zeroing.
"""

from __future__ import annotations

import contextlib

import torch

from lathe.train import runtime
from lathe.train.optim import schedules
from lathe.train.parallel import distributed


class PlainBackend:
    """torch autograd and the optimizer as given (also under DDP and FSDP2)."""

    def __init__(self, model, parameters: list, optimizer, lr_scheduler):
        self.accumulate_locally = distributed.local_accumulation(model)  # DDP / FSDP2 / one process
        # Lists made once: walking the module tree on every step costs more than the step of a small model.
        self.parameters = list(parameters)
        self.trainable_parameters = [parameter for parameter in self.parameters if parameter.requires_grad]
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.grad_norm = None  # the total norm before clipping of the last update (logged as grad_norm)
        # Optimizers that change which parameters train (BAdam's blocks) or give sparse gradients say so.
        self.flips_requires_grad = bool(getattr(optimizer, "changes_requires_grad", False))
        self.sparse_gradients = bool(getattr(optimizer, "sparse_gradients", False))

    def gradient_sync(self, sync: bool):
        """The context of one micro-batch's forward and backward. Gradients are reduced across ranks
        only when `sync` (the window's last micro-batch): the earlier ones accumulate locally, so an
        update costs one all-reduce however many micro-batches it has."""
        return runtime.NO_CONTEXT if sync else self.accumulate_locally()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_gradients(self, max_norm: float | None) -> None:
        """Clip the total norm to max_norm (0 or None: no clipping, and no norm is logged)."""
        if self.flips_requires_grad:  # BAdam trains one block at a time: clip what trains now
            self.trainable_parameters = [parameter for parameter in self.parameters if parameter.requires_grad]
        clip = max_norm and max_norm > 0
        self.grad_norm = (
            runtime.clip_gradients(self.trainable_parameters, max_norm, self.sparse_gradients) if clip else None
        )

    def optimizer_step(self) -> bool:
        """Apply the update; False when it was skipped (then the schedule does not advance either)."""
        self.optimizer.step()
        return True

    def scheduler_step(self) -> None:
        # ReduceLROnPlateau and GreedyLR step on an evaluation metric instead (Trainer._evaluate).
        if not schedules.steps_on_metric(self.lr_scheduler):
            self.lr_scheduler.step()

    def zero_grad(self) -> None:
        runtime.clear_gradients(self.parameters)


class GradScalerBackend(PlainBackend):
    """fp16: the loss is multiplied by a scale before backward so that small gradients survive in fp16;
    the gradients are divided by it again before clipping, so clipping and the logged norm see the true
    values. A step whose gradients overflowed (inf / nan) is skipped and the scale lowered."""

    def __init__(self, model, parameters: list, optimizer, lr_scheduler, scaler):
        super().__init__(model, parameters, optimizer, lr_scheduler)
        self.scaler = scaler

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def clip_gradients(self, max_norm: float | None) -> None:
        self.scaler.unscale_(self.optimizer)  # also without clipping: on_pre_optimizer_step sees true gradients
        super().clip_gradients(max_norm)

    def optimizer_step(self) -> bool:
        scale_before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= scale_before  # a lowered scale means inf/nan gradients: no update


class DeepSpeedBackend:
    """DeepSpeed's engine (lathe.train.parallel.deepspeed_zero): its backward reduces gradients into
    each rank's partition, and its step clips (gradient_clipping), steps the partitioned optimizer and the
    scheduler (not after an fp16 overflow) and zeroes, so the last three methods have nothing left to do."""

    def __init__(self, engine):
        self.engine = engine
        self.grad_norm = None

    def gradient_sync(self, sync: bool):
        self.engine.set_gradient_accumulation_boundary(sync)  # the engine reduces at the window's end
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        from lathe.train.parallel import deepspeed_zero

        deepspeed_zero.backward(self.engine, loss)

    def clip_gradients(self, max_norm: float | None) -> None:
        pass  # inside engine.step(), from the config's gradient_clipping (= max_grad_norm)

    def optimizer_step(self) -> bool:
        from lathe.train.parallel import deepspeed_zero

        self.grad_norm = deepspeed_zero.step(self.engine)
        return True

    def scheduler_step(self) -> None:
        pass  # engine.step() stepped it

    def zero_grad(self) -> None:
        pass  # engine.step() zeroed them


def choose_backend(model, parameters: list, optimizer, lr_scheduler, scaler=None, engine=None):
    """The back-end of a run over `model` (as trained: wrapped in DDP, sharded by FSDP2 or compiled):
    DeepSpeed's engine when there is one, else fp16 loss scaling when there is a GradScaler, else plain
    autograd. `parameters`: the model's own, in a list (the ones the back-end clips and zeroes)."""
    if engine is not None:
        return DeepSpeedBackend(engine)
    if scaler is not None:
        return GradScalerBackend(model, parameters, optimizer, lr_scheduler, scaler)
    return PlainBackend(model, parameters, optimizer, lr_scheduler)
