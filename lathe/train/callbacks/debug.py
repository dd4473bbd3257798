"""debug="underflow_overflow": forward hooks that stop training at the first inf/nan in a module's weights,
inputs or outputs and print the frames (abs min / abs max per tensor) of the modules run just before it."""

from __future__ import annotations

import collections

import torch

from lathe.train.callbacks.events import TrainerCallback

__all__ = ["DebugUnderflowOverflow", "UnderflowOverflowCallback"]


class DebugUnderflowOverflow:
    """Hook every module of `model`. Each forward adds a frame (module name and class, then abs min, abs max
    of each parameter, input and output); the last `max_frames_to_save` are kept. At the first inf/nan the
    frames are printed and a ValueError stops the run. `trace_batch_nums` prints the frames of those batches
    instead; `abort_after_batch_num` stops after that batch."""

    def __init__(self, model, max_frames_to_save=21, trace_batch_nums=None, abort_after_batch_num=None):
        self.model = model
        self.trace_batch_nums = list(trace_batch_nums or [])
        self.abort_after_batch_num = abort_after_batch_num
        self.frames = collections.deque([], max_frames_to_save)
        self.batch_number = 0
        self.detected_overflow = False
        self.module_names = {module: name for name, module in model.named_modules()}
        self.handles = [module.register_forward_hook(self.forward_hook) for module in model.modules()]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _describe(self, value, context: str) -> list[str]:
        if isinstance(value, (tuple, list)):
            return [line for i, item in enumerate(value) for line in self._describe(item, f"{context}[{i}]")]
        if not torch.is_tensor(value):
            return [f"{'None' if value is None else 'not a tensor':>17} {context}"]
        magnitude = value.detach().abs().float()
        if not torch.isfinite(magnitude).all():
            self.detected_overflow = True
        if magnitude.numel() == 0:
            return [f"{'empty':>17} {context}"]
        return [f"{magnitude.min():8.2e} {magnitude.max():8.2e} {context}"]

    def forward_hook(self, module, inputs, output):
        trace = self.batch_number in self.trace_batch_nums
        if trace:
            self.frames.clear()
        lines = [f"{'':17} {self.module_names.get(module, '?')} {type(module).__name__}"]
        for name, parameter in module.named_parameters(recurse=False):
            lines += self._describe(parameter, name)
        lines += self._describe(tuple(inputs), "input")
        lines += self._describe(output if isinstance(output, tuple) else (output,), "output")
        self.frames.append("\n".join(lines))
        if module is self.model:  # the outermost forward ends last: the batch is done
            self.batch_number += 1
        if trace:
            print("\n".join(self.frames))
        if self.detected_overflow and not trace:
            print(f"\nDetected inf/nan during batch_number={self.batch_number}")
            print(f"Last {len(self.frames)} forward frames:\n{'abs min':8} {'abs max':8} metadata")
            print("\n".join(self.frames) + "\n\n")
            raise ValueError(
                "DebugUnderflowOverflow: inf/nan detected, aborting as there is no point running further. "
                "Please scroll up above this traceback to see the activation values prior to this event."
            )
        if self.abort_after_batch_num is not None and self.batch_number > self.abort_after_batch_num:
            raise ValueError(
                f"DebugUnderflowOverflow: aborting after {self.batch_number} batches due to "
                f"`abort_after_batch_num={self.abort_after_batch_num}` arg"
            )


class UnderflowOverflowCallback(TrainerCallback):
    """Added by the Trainer for debug="underflow_overflow": hooks the model when training begins."""

    def __init__(self):
        self.debugger = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.debugger is None or self.debugger.model is not model:
            if self.debugger is not None:
                self.debugger.remove()
            self.debugger = DebugUnderflowOverflow(model)
