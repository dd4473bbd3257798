"""Quiet collectives: torch's deprecation FutureWarnings for the collectives DeepSpeed calls, silenced around
lathe's calls into DeepSpeed only (a leaf: deepspeed_zero, deepspeed_checkpoint and runtime use it)."""

from __future__ import annotations

import contextlib
import warnings

# torch 2.13 deprecates the collectives DeepSpeed calls (reduce_scatter_tensor, all_gather_into_tensor, ...):
# a FutureWarning per call site and rank that only DeepSpeed can act on. Silenced only around lathe's calls
# into the engine (and ZeRO-3's gathering forward: runtime.compute_loss_context_manager), not process-wide.
DEPRECATED_COLLECTIVES = r"`torch\.distributed\.\w+` is deprecated\. Please use `torch\.distributed\.\w+` instead"


@contextlib.contextmanager
def quiet_collectives():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DEPRECATED_COLLECTIVES, category=FutureWarning)
        yield
