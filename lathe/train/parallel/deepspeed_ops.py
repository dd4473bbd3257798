"""A first DeepSpeed run compiles C++ ops (JIT, through torch.utils.cpp_extension): say so before the wait.

On a CPU, DeepSpeed builds its shared-memory collectives (`deepspeed_shm_comm`) when its process group
starts, and ZeRO-Offload builds CPU Adam (`cpu_adam`) or CPU Adagrad (`cpu_adagrad`); each takes a minute
or more on a few cores, once, with no output (the result is cached under torch's extensions folder). An op
DeepSpeed was installed with (DS_BUILD_OPS) or already in that cache is not mentioned.
"""

from __future__ import annotations

import glob
import logging
import os

__all__ = ["ops_to_build", "compile_notice", "announce_compiles"]

logger = logging.getLogger(__name__)

# Rough seconds per op on a few idle cores (a guess to set expectations, not a promise); a busy machine
# takes several times longer (a shm-op build watched on a shared 2-core machine, niced, ran 6 minutes).
ROUGH_SECONDS = {"deepspeed_shm_comm": 60, "cpu_adam": 90, "cpu_adagrad": 90}


def ops_to_build(config: dict, on_cpu: bool) -> list[str]:
    """The JIT ops this DeepSpeed config makes DeepSpeed load: shm collectives on a CPU, the offload optimizer."""
    ops = ["deepspeed_shm_comm"] if on_cpu else []
    device = ((config.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device", "none")
    if device not in (None, "none") and config.get("zero_force_ds_cpu_optimizer", True):
        ops.append(
            "cpu_adagrad" if "adagrad" in str((config.get("optimizer") or {}).get("type", "")).lower() else "cpu_adam"
        )
    return ops


def _built(name: str, build_root: str, installed: dict) -> bool:
    if installed.get(name.replace("deepspeed_", "")) or installed.get(name):
        return True
    return bool(
        glob.glob(os.path.join(build_root, "*", name, f"{name}.so"))
        + glob.glob(os.path.join(build_root, name, f"{name}.so"))
    )


def compile_notice(ops: list[str], build_root: str, installed: dict) -> str | None:
    """One line naming the ops that will be compiled now and roughly how long; None when all are built."""
    missing = [name for name in ops if not _built(name, build_root, installed)]
    if not missing:
        return None
    minutes = max(1, round(sum(ROUGH_SECONDS.get(name, 60) for name in missing) / 60))
    return (
        f"DeepSpeed is compiling its CPU ops {', '.join(missing)} (first run only; about {minutes} minute"
        f"{'s' if minutes > 1 else ''} on a few cores, longer on a busy machine; cached in {build_root})."
    )


def announce_compiles(config: dict, args) -> None:
    """Log compile_notice for this config on each machine's first process (deepspeed is imported by then)."""
    if getattr(args, "local_process_index", 0) != 0:
        return
    try:
        import torch
        from deepspeed.git_version_info import installed_ops
        from torch.utils.cpp_extension import get_default_build_root
    except ImportError:
        return
    ops = ops_to_build(config, on_cpu=not torch.cuda.is_available())
    # torch's own rule for where JIT extensions go (torch.utils.cpp_extension._get_build_directory)
    build_root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    notice = compile_notice(ops, build_root, dict(installed_ops))
    if notice:
        logger.warning(notice)
