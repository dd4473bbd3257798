"""DeepSpeed's checkpoint files in a lathe checkpoint: global_stepN/ and `latest`, written and read safely.

DeepSpeed opens its files with pickle; lathe gives the engine a loader that uses torch.load(weights_only=True),
allowing only the few DeepSpeed classes its files hold, so a checkpoint cannot run code. The engine itself is
set up in lathe.train.parallel.deepspeed_zero, which imports DeepSpeed.
"""

from __future__ import annotations

import glob
import os

# The classes DeepSpeed's checkpoint files hold besides tensors and plain containers.
_CHECKPOINT_CLASSES = (
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
)


def full_state_dict(engine):
    """The model's full weights, on rank 0 (a collective under stage 3: every rank calls it).
    Stages 0-2 keep the weights whole on every rank, but as views into one flat buffer, which
    safetensors refuses to save: each is copied (tied weights stay one tensor). None on other
    ranks under stage 3."""
    if engine.zero_optimization_stage() == 3:  # partitioned weights
        from lathe.train.parallel.quiet_collectives import quiet_collectives

        with quiet_collectives():
            return engine._zero3_consolidated_16bit_state_dict()
    copies, state = {}, {}
    for name, tensor in engine.module.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if key not in copies:
            copies[key] = tensor.detach().clone()
        state[name] = copies[key]
    return state


def tag(global_step: int) -> str:
    return f"global_step{global_step}"


def save(engine, folder: str, global_step: int, exclude_frozen: bool) -> None:
    """DeepSpeed's files for `folder` (every rank writes its optimizer partition): global_stepN/ and `latest`."""
    from lathe.train.parallel.quiet_collectives import quiet_collectives

    with quiet_collectives():
        engine.save_checkpoint(folder, tag=tag(global_step), exclude_frozen_parameters=exclude_frozen)


def has_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "latest"))


def load(engine, path: str, strict: bool) -> None:
    """Weights, optimizer partitions and scheduler from `path` (written by save). The optimizer state is
    partitioned over the ranks that wrote it, so the number of processes must be the same."""
    with open(os.path.join(path, "latest"), encoding="utf-8") as f:
        name = f.read().strip()
    folder = os.path.join(path, name)
    ranks = len(glob.glob(os.path.join(folder, "*zero_pp_rank_*_optim_states.pt")))
    now = engine.dp_world_size
    if engine.zero_optimization_stage() > 0 and ranks != now:
        raise ValueError(
            f"Checkpoint {path!r} holds DeepSpeed ZeRO optimizer state partitioned over {ranks} processes; resume it with "
            f"{ranks} processes (now {now}). To continue under another number, convert it to a universal checkpoint with "
            "DeepSpeed's ds_to_universal.py, or start a new run from its model.safetensors."
        )
    from lathe.train.parallel.quiet_collectives import quiet_collectives

    with quiet_collectives():
        load_path, _ = engine.load_checkpoint(
            path, tag=name, load_module_strict=strict, load_optimizer_states=True, load_lr_scheduler_states=True
        )
    if load_path is None:
        raise ValueError(f"DeepSpeed could not load its checkpoint from {folder!r}.")


def safe_checkpoint_engine(original):
    """DeepSpeed's torch checkpoint engine, with load() on torch.load(weights_only=True) that allows
    DeepSpeed's checkpoint classes and nothing else (lathe.train.checkpoints.loading: a file holding other
    objects, or a damaged one, is an error naming it)."""
    from lathe.train.checkpoints.loading import safe_torch_load

    class SafeTorchCheckpointEngine(type(original)):
        def load(self, path: str, map_location=None):
            return safe_torch_load(path, map_location=map_location, allowed=_allowed_classes())

    original.__class__ = SafeTorchCheckpointEngine
    return original


def _allowed_classes() -> list:
    import importlib

    allowed = []
    for module, name in _CHECKPOINT_CLASSES:
        try:
            allowed.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return allowed
