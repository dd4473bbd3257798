"""GRPO across processes, as TRL does it through accelerate: each process samples and scores its share of the
generation batch, the rewards (and the numbers logged) are gathered in rank order so that the group advantages
and the logs are the whole batch's, and each process keeps its own slice. One process: everything is local."""

from __future__ import annotations

import torch

from lathe.train.parallel.distributed import gather_objects, is_distributed


def gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every process's `tensor` concatenated along dim 0 in rank order (a 0-d tensor counts as one row), on
    the tensor's device."""
    if not is_distributed():
        return tensor
    rows = tensor.detach().reshape(-1) if tensor.dim() == 0 else tensor.detach()
    parts = gather_objects(rows.cpu())
    return torch.cat(parts).to(tensor.device)


def total(value: torch.Tensor) -> torch.Tensor:
    """The sum over processes of a tensor (element-wise)."""
    if not is_distributed():
        return value
    import torch.distributed as dist

    summed = value.detach().clone()
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return summed


def local_slice(process_index: int, size: int) -> slice:
    """This process's rows of a gathered batch of `size` rows per process."""
    return slice(process_index * size, (process_index + 1) * size)
