"""Several processes on torch.distributed, as `torchrun` launches them: the process group, the model
wrapped in DistributedDataParallel, gradients synchronised only on the last micro-batch of an
accumulation window, and the collectives the step maths and evaluation need. In a single process
every function here is a no-op, and the Trainer's loop reads the same either way.

What makes N processes train the model one process would (tests/train/test_distributed.py):
- each rank takes every N-th batch of the same seeded epoch order (lathe.train.data.sampling), so one update
  sees the samples a single process with N times the batch would see;
- DDP averages gradients over ranks; losses normalised by a token count use the count summed over
  ranks (average_tokens_across_devices), so they are scaled by N to undo that average;
- the logged loss is the mean over ranks; evaluation gathers every rank's batches back into dataset
  order and drops the repeated samples that even sharding adds.
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

logger = logging.getLogger(__name__)


def launched_world_size() -> int:
    """How many processes torchrun (or another launcher that sets WORLD_SIZE) started."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def init_process_group(args) -> None:
    """Join the process group the launcher described (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), once."""
    import torch.distributed as dist

    if launched_world_size() <= 1 or not dist.is_available() or dist.is_initialized():
        return
    backend = args.ddp_backend
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and not args.use_cpu else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=args.ddp_timeout_delta)
    leave_process_group_at_exit()
    logger.info("Process %d of %d joined the %s process group.", dist.get_rank(), dist.get_world_size(), backend)


def leave_process_group_at_exit() -> None:
    """Let the backend's threads finish, then destroy the process group lathe joined, while the
    interpreter is still whole. Why: gloo's worker threads drop the last reference to a finished
    asynchronous collective (DeepSpeed's all-gathers) only once they get the GIL; if the interpreter is
    already finalizing by then, the thread is killed inside a C++ destructor and the process aborts
    ("terminate called without an active exception", exit -6) after a run that succeeded. Seen in about
    1 DeepSpeed run in 5 under gdb: a pt_gloo_runloop thread in ~AsyncAllgatherWork waiting for the GIL."""
    import atexit

    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    import time

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        time.sleep(0.05)  # releases the GIL: a worker thread waiting for it drops its finished work now
        try:
            dist.destroy_process_group()
        except Exception as error:  # exiting anyway; say why the clean-up failed, do not mask the exit code
            logger.warning("Leaving the process group at exit failed: %s", error)
        time.sleep(0.05)


def is_distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if is_distributed() else 1


def wrap_model(model, args):
    """DistributedDataParallel around the model when there are several processes (else the model).
    Under DeepSpeed the engine does the data parallelism (lathe.train.parallel.deepspeed_zero)."""
    if not is_distributed() or args.deepspeed:
        return model
    from lathe.train.parallel.fsdp import settings_from_args, shard_model

    fsdp_settings = settings_from_args(args)
    if fsdp_settings is not None:
        return shard_model(model, args, fsdp_settings)  # in place: FSDP2 modules, not a wrapper
    from torch.nn.parallel import DistributedDataParallel

    find_unused = args.ddp_find_unused_parameters
    if find_unused is None:
        # transformers' rule: a transformers model uses all its parameters unless activation
        # checkpointing hides them from autograd's first pass; any other module may not.
        find_unused = (
            (not args.gradient_checkpointing)
            if hasattr(model, "config") and hasattr(model, "save_pretrained")
            else True
        )
    options = {"find_unused_parameters": find_unused}
    if args.ddp_bucket_cap_mb is not None:
        options["bucket_cap_mb"] = args.ddp_bucket_cap_mb
    if args.ddp_broadcast_buffers is not None:
        options["broadcast_buffers"] = args.ddp_broadcast_buffers
    if args.ddp_static_graph is not None:
        options["static_graph"] = args.ddp_static_graph
    device = next(model.parameters()).device
    if device.type == "cuda":
        options["device_ids"] = [device.index]
    return DistributedDataParallel(model, **options)


def local_accumulation(model):
    """The context in which `model`'s backward accumulates gradients locally, without reducing them
    across ranks: DDP's no_sync, FSDP2's set_requires_gradient_sync(False), or nothing in one process.
    The back-end (stepping.py) enters it on every micro-batch of a window but the last: summing k local
    gradients and then averaging over ranks equals averaging every micro-batch's over ranks, at one
    all-reduce per update instead of k. (DeepSpeed's engine: stepping.DeepSpeedBackend.)"""
    if hasattr(model, "set_requires_gradient_sync"):
        return lambda: _fsdp_no_sync(model)
    if hasattr(model, "no_sync"):
        return model.no_sync
    return contextlib.nullcontext


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def sum_across_ranks(value: int | torch.Tensor, device) -> int | torch.Tensor:
    """The sum over ranks (e.g. label tokens of an update window)."""
    if not is_distributed():
        return value
    import torch.distributed as dist

    tensor = value.detach().clone() if torch.is_tensor(value) else torch.tensor(value, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor if torch.is_tensor(value) else int(tensor.item())


def mean_across_ranks(value: float, device) -> float:
    if not is_distributed():
        return value
    import torch.distributed as dist

    tensor = torch.tensor(float(value), dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item()) / dist.get_world_size()


def gather_objects(value) -> list:
    """Every rank's `value` (pickled), in rank order; [value] in a single process."""
    if not is_distributed():
        return [value]
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


# What a collective's error says when the process at the other end is gone (gloo, NCCL) or stuck
# past ddp_timeout: RuntimeErrors from deep inside the backend that do not tell the user what happened.
_LOST_PEER_SIGNS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "gloo/transport",
    "Timed out",
    "timed out",
    "NCCL",
    "DistBackendError",
    "DistNetworkError",
    "Socket Timeout",
)


def explain_lost_process(error: BaseException, args, step: int) -> Exception | None:
    """A clear error for a collective that failed because another process died or hung (None for
    any other error): which process saw it and when, where to look, and what is safe to resume."""
    if not is_distributed() or not isinstance(error, RuntimeError):
        return None
    message = str(error)
    if not any(sign in message for sign in _LOST_PEER_SIGNS):
        return None
    import torch.distributed as dist

    from lathe.train.checkpoints.layout import get_last_checkpoint

    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    resume = (
        f"The last complete checkpoint, {last}, is intact: resume from it with resume_from_checkpoint=True."
        if last
        else "No checkpoint was completed yet, so a new run starts from the beginning."
    )
    first_line = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return RuntimeError(
        f"Process {dist.get_rank()} of {dist.get_world_size()} lost contact with the other processes after step {step} "
        f"({first_line[:300]}). Another process most likely died or hung: its own log, or torchrun's failure summary, says why. "
        f"A process that hangs instead of dying is waited for ddp_timeout seconds ({args.ddp_timeout} now). {resume}"
    )


def interleave_batches(per_rank: list[list]) -> list:
    """Rank r's k-th batch is global batch k * N + r (lathe.train.data.sampling shards batches round robin):
    put them back in that order."""
    ordered = []
    for k in range(max((len(batches) for batches in per_rank), default=0)):
        ordered.extend(batches[k] for batches in per_rank if k < len(batches))
    return ordered
