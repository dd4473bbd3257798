"""What half precision adds to the memory plan beyond halving the activations' element size: autocast's
low-precision copies of float32 weights. Under `bf16`/`fp16` (autocast) every matmul casts its float32
weight, and the copy is saved for backward until that layer's backward runs; weights stored in half
precision (`pure_bf16`, a LoRA run's frozen base) are used as they are. Measured with autograd's
saved-tensor hooks (tests/llm/test_memory_plan.py)."""

from __future__ import annotations

__all__ = ["autocast_weight_copies"]


def autocast_weight_copies(model) -> int:
    """Bytes of the half-precision copies autocast makes of float32 linear weights during one forward."""
    import torch

    total = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear) and weight is not None and weight.dtype == torch.float32:
            total += weight.numel() * 2
    return total
