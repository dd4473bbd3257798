"""The collectives behind Trainer.accelerator (accelerator.py), as accelerate.utils.operations defines them:
on lathe's torch.distributed group when several processes run, the identity (or a copy) in one."""

from __future__ import annotations

import torch

from lathe.train.parallel import distributed


def apply_nested(function, data, what: str):
    """accelerate's recursively_apply with error_on_other_type: tensors anywhere in lists, tuples and mappings."""
    if torch.is_tensor(data):
        return function(data)
    if isinstance(data, (list, tuple)):
        applied = [apply_nested(function, item, what) for item in data]
        return type(data)(*applied) if hasattr(data, "_fields") else type(data)(applied)
    if isinstance(data, dict) or hasattr(data, "keys") and hasattr(data, "__getitem__"):
        return type(data)({key: apply_nested(function, data[key], what) for key in data})
    raise TypeError(
        f"Trainer.accelerator.{what}: unsupported type {type(data).__name__}; only nested lists, tuples and dicts "
        "of tensors are supported."
    )


def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    if tensor.ndim == 0:
        tensor = tensor.clone()[None]
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return torch.cat(parts, dim=0)


def gather_object(obj):
    """accelerate.utils.gather_object: every process's list, concatenated in rank order; the object in one process."""
    if not distributed.is_distributed():
        return obj
    return [item for per_rank in distributed.gather_objects(obj) for item in per_rank]


def pad_to_largest(tensor: torch.Tensor, dim: int, pad_index: int, pad_first: bool) -> torch.Tensor:
    if dim >= tensor.ndim or dim < -tensor.ndim:
        return tensor
    dim = dim % tensor.ndim
    if not distributed.is_distributed():
        return tensor
    sizes = all_gather(torch.tensor(tensor.shape, device=tensor.device)[None]).cpu()
    max_size = int(max(size[dim] for size in sizes))
    if max_size == tensor.shape[dim]:
        return tensor
    new_size = list(tensor.shape)
    new_size[dim] = max_size
    padded = tensor.new_zeros(tuple(new_size)) + pad_index
    start = max_size - tensor.shape[dim] if pad_first else 0
    index = [slice(None)] * tensor.ndim
    index[dim] = slice(start, start + tensor.shape[dim])
    padded[tuple(index)] = tensor
    return padded


def reduce_copy(tensor: torch.Tensor, reduction: str) -> torch.Tensor:
    copy = tensor.clone()
    if not distributed.is_distributed():
        return copy
    import torch.distributed as dist

    dist.all_reduce(copy, op=dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM)
    if reduction == "mean":
        copy /= dist.get_world_size()
    return copy


def split_share(inputs, num_processes: int, index: int, apply_padding: bool):
    if num_processes == 1:
        return inputs
    length = len(inputs) if not isinstance(inputs, dict) else len(next(iter(inputs.values())))
    per_process, extras = divmod(length, num_processes)
    start = index * per_process + min(index, extras)
    end = start + per_process + (1 if index < extras else 0)

    def take(values):
        part = values[start:end]
        missing = per_process + (1 if extras else 0) - len(part)
        if apply_padding and missing > 0:  # repeat the last element, as accelerate does
            part = (
                torch.cat([part, values[-1:].expand(missing, *values.shape[1:])])
                if torch.is_tensor(part)
                else (part + type(part)([values[-1]] * missing))
            )
        return part

    if isinstance(inputs, dict):
        return {key: take(value) for key, value in inputs.items()}
    return take(inputs)
