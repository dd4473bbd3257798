"""What a `lathe train` run measured, for the end of its output: tokens per second and peak memory, printed
beside the memory plan's estimate. Nothing here reaches log_history, trainer_state.json or train_results.json:
those stay as transformers and LLaMA-Factory write them (include_num_input_tokens_seen still adds its keys)."""

from __future__ import annotations

import sys

__all__ = ["TokenMeterMixin", "peak_host_bytes", "peak_device_bytes", "summary_lines"]


class TokenMeterMixin:
    """Mixed into the recipes' Trainers (before the Trainer class): counts the non-padding input tokens of
    every training micro-batch, whatever include_num_input_tokens_seen says.

    The count is taken before training_step moves the batch: on the host it is a sum over a CPU tensor,
    no device work. A batch that a custom loader already put on an accelerator adds to a tensor kept on
    that device, read once at the end: no host-device sync per step."""

    def train(self, *args, **kwargs):
        self.meter_tokens_on_host, self.meter_tokens_on_device = 0, None  # this train() call's tokens only
        return super().train(*args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        count = input_token_count(inputs)
        if count is not None:
            if count.device.type == "cpu":
                self.meter_tokens_on_host = getattr(self, "meter_tokens_on_host", 0) + int(count)
            else:
                previous = getattr(self, "meter_tokens_on_device", None)
                self.meter_tokens_on_device = count if previous is None else previous + count
        return super().training_step(model, inputs, num_items_in_batch)

    def tokens_trained(self) -> int:
        """The tokens of this train() call, all processes together (every rank must call it: one all-reduce)."""
        import torch
        import torch.distributed as dist

        total = getattr(self, "meter_tokens_on_host", 0)
        on_device = getattr(self, "meter_tokens_on_device", None)
        if on_device is not None:
            total += int(on_device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = self.args.device if dist.get_backend() == "nccl" else torch.device("cpu")
            summed = torch.tensor(total, dtype=torch.int64, device=device)
            dist.all_reduce(summed)
            total = int(summed)
        return total


def input_token_count(inputs):
    """The non-padding tokens of a batch as a 0-dim tensor (on the batch's device): the attention_mask's
    non-zero entries (neat_packing numbers its sequences 1, 2, ...), else every input_ids position."""
    if not isinstance(inputs, dict) and not hasattr(inputs, "keys"):
        return None
    mask, ids = inputs.get("attention_mask"), inputs.get("input_ids")
    if mask is not None and ids is not None and mask.shape == ids.shape:
        return (mask != 0).sum()
    if ids is not None:
        import torch

        return torch.tensor(ids.numel())
    return None


def peak_host_bytes() -> int | None:
    """This process's peak resident memory (ru_maxrss: KiB on Linux, bytes on macOS); None where unknown."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def peak_device_bytes(device) -> int | None:
    """torch.cuda.max_memory_allocated on a CUDA device (this process, since it started); None elsewhere."""
    import torch

    if getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(device)


def _mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"


def summary_lines(tokens: int, runtime: float, plan_peak: int | None, device=None) -> list[str]:
    """The two lines: throughput (tokens / train_runtime) and peak memory, measured beside planned."""
    rate = tokens / runtime if runtime > 0 else 0.0
    lines = [f"throughput: {tokens:,} tokens in {runtime:.2f} s = {rate:,.1f} tokens/s (non-padding input tokens)"]
    measured = []
    on_device = peak_device_bytes(device)
    if on_device is not None:
        measured.append(f"{_mib(on_device)} device (max allocated)")
    host = peak_host_bytes()
    if host is not None:
        measured.append(f"{_mib(host)} host (peak RSS)")
    planned = f"plan {_mib(plan_peak)} per device" if plan_peak is not None else "no plan estimate for this run"
    lines.append(f"peak memory: measured {', '.join(measured) or 'unknown'} / {planned}")
    return lines
