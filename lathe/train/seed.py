"""Reproducibility: set_seed and enable_full_determinism (python, numpy, torch, CUDA), and the
capture and restore of every generator's state that exact resume needs."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); with `deterministic`, also ask torch for
    deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def enable_full_determinism(seed: int, warn_only: bool = False) -> None:
    """set_seed plus deterministic algorithms and the cuBLAS/cuDNN settings they need.

    CUBLAS_WORKSPACE_CONFIG must be set before the first cuBLAS call for deterministic matmuls;
    that is why this writes to the environment (the one place lathe does).
    """
    set_seed(seed)
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def capture_rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if torch.cuda.is_available() and "cuda" in state:
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)) and len(cuda) == torch.cuda.device_count():
            torch.cuda.random.set_rng_state_all(cuda)
        elif not isinstance(cuda, (list, tuple)):
            torch.cuda.random.set_rng_state(cuda)


def rng_state_problem(state) -> str | None:
    """Why `state` (read from a checkpoint) cannot be restored, or None. Each part is tried on a
    generator of its own, so the global ones stay untouched until resume restores them."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not the dict of generator states a Trainer saves"
    missing = [key for key in ("python", "numpy", "cpu") if key not in state]
    if missing:
        return f"it has no {', '.join(missing)} generator state"
    try:
        random.Random().setstate(state["python"])
        np.random.RandomState().set_state(state["numpy"])
        torch.Generator().set_state(state["cpu"])
    except (TypeError, ValueError, RuntimeError, IndexError, KeyError, OverflowError) as error:
        return f"its generator states cannot be restored ({type(error).__name__}: {error})"
    return None
