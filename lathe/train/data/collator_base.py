"""What every collator shares: `return_tensors` ("pt" or "np"), the mixin that picks torch_call or
numpy_call, and transformers' collator type names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

InputDataClass = Any
# A collator: a list of dataset items in, one batch (a dict of tensors or arrays) out.
DataCollator = Callable[[list[InputDataClass]], dict[str, Any]]

RETURN_TENSORS = ("pt", "np")


def check_return_tensors(return_tensors) -> None:
    if return_tensors not in RETURN_TENSORS:
        raise ValueError(
            f"Framework {return_tensors!r} not recognized: return_tensors must be 'pt' (PyTorch tensors) "
            "or 'np' (NumPy arrays)."
        )


def to_numpy(value) -> np.ndarray:
    """An array from a tensor (detached, on the CPU), an array, or anything np.array takes."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.array(value)


def convert_batch(batch, return_tensors: str):
    """The batch as `return_tensors` asks: tensors stay for "pt", become arrays for "np" (same dtypes);
    values that are not tensors (e.g. `max_length_q`) stay as they are."""
    check_return_tensors(return_tensors)
    if return_tensors == "pt":
        return batch
    if isinstance(batch, tuple):
        return tuple(to_numpy(value) for value in batch)
    for key in list(batch.keys()):  # in place: also keeps a tokenizer's BatchEncoding its type
        if isinstance(batch[key], torch.Tensor):
            batch[key] = to_numpy(batch[key])
    return batch


class DataCollatorMixin:
    """`collator(features, return_tensors=None)` calls `torch_call` for "pt" and `numpy_call` for "np"
    (by default `torch_call`'s batch as arrays of the same dtypes); None means `self.return_tensors`."""

    return_tensors: str = "pt"

    def __call__(self, features, return_tensors: str | None = None):
        return_tensors = self.return_tensors if return_tensors is None else return_tensors
        check_return_tensors(return_tensors)
        if return_tensors == "np":
            return self.numpy_call(features)
        return self.torch_call(features)

    def numpy_call(self, features):
        return convert_batch(self.torch_call(features), "np")


def pad_without_fast_tokenizer_warning(tokenizer, *pad_args, **pad_kwargs):
    """`tokenizer.pad(...)` without the "a fast tokenizer pads faster while encoding" warning (which
    collators cannot act on), the warning's state restored afterwards."""
    warnings_state = getattr(tokenizer, "deprecation_warnings", None)
    if warnings_state is None:  # feature extractors and minimal tokenizers have no such warning
        return tokenizer.pad(*pad_args, **pad_kwargs)
    key = "Asking-to-pad-a-fast-tokenizer"
    before = warnings_state.get(key, False)
    warnings_state[key] = True
    try:
        return tokenizer.pad(*pad_args, **pad_kwargs)
    finally:
        warnings_state[key] = before
