"""Reading a checkpoint's files safely: torch.load(weights_only=True), with errors that name the
file and say what is wrong (empty, corrupt, objects lathe refuses to unpickle, a state that does not
fit the optimizer, scheduler or generators it is loaded into)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import torch

from lathe.train.checkpoints.layout import CheckpointFileError
from lathe.train.seed import rng_state_problem


def safe_torch_load(path: str, map_location=None, allowed: list | None = None):
    """torch.load with weights_only=True; numpy's RNG state (an ndarray inside a tuple) needs its
    reconstruction functions allow-listed, nothing else is (`allowed` adds classes). A file that
    cannot be read is a CheckpointFileError naming it: empty, corrupt, or holding objects lathe
    refuses to unpickle."""
    try:
        if os.path.getsize(path) == 0:
            raise CheckpointFileError(
                f"{path!r} is empty (0 bytes): it was cut short while saving or truncated later. "
                "Resume from an earlier checkpoint."
            )
    except OSError as error:
        raise CheckpointFileError(f"Cannot read {path!r}: {error.strerror or error}.") from None
    allowed = list(allowed or []) + [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        allowed.append(np._core.multiarray._reconstruct)
    except AttributeError:  # numpy < 2
        allowed.append(np.core.multiarray._reconstruct)
    with torch.serialization.safe_globals(allowed):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            # Not chained (`from None`): torch's own message recommends weights_only=False, which
            # would execute whatever the file holds.
            raise CheckpointFileError(_refused_to_unpickle(path, error)) from None
        except Exception as error:  # torch reports a damaged file as RuntimeError, EOFError, KeyError, ...
            raise CheckpointFileError(
                f"{path!r} is corrupt or truncated: torch.load cannot read it ({_load_error_detail(error)}). "
                "Resume from an earlier checkpoint."
            ) from None


def _refused_to_unpickle(path: str, error: Exception) -> str:
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not torch.save's zip format: a raw pickle or corrupt bytes
        names = []
    what = (
        f"it refers to {', '.join(names)}, which is neither a tensor nor plain data"
        if names
        else f"it is not torch.save's format of tensors and plain data ({_load_error_detail(error)})"
    )
    return (
        f"lathe refused to unpickle {path!r}: {what}. Unpickling such a file can run any code it holds, so "
        "lathe loads checkpoint files only as tensors and plain data. If this file did not come from a "
        "Trainer you ran, delete it; resume from a checkpoint written by lathe or transformers."
    )


def _load_error_detail(error: Exception) -> str:
    """The lines of torch's message that describe the file, without its advice on weights_only."""
    lines = [line.strip() for line in str(error).splitlines()]
    kept = [line for line in lines if line and "weights_only" not in line and "documentation" not in line]
    detail = " ".join(kept) or type(error).__name__
    return detail if len(detail) <= 300 else detail[:300] + "..."


def load_state_into(target, path: str, what: str, map_location=None, allowed: list | None = None) -> None:
    """target.load_state_dict(the state in `path`), with a CheckpointFileError naming the file when it
    does not fit (another optimizer's state, a scheduler state without its step count, ...). `allowed`:
    classes the state may hold besides tensors (GaLore's and APOLLO's projectors in optimizer state)."""
    state = safe_torch_load(path, map_location=map_location, allowed=allowed)
    # A learning-rate scheduler takes any dict into its __dict__: without last_epoch it would silently restart.
    if hasattr(target, "last_epoch") and not (isinstance(state, dict) and "last_epoch" in state):
        raise _does_not_fit(path, what, "it has no 'last_epoch'")
    try:
        target.load_state_dict(state)
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError, AttributeError) as error:
        raise _does_not_fit(path, what, f"{type(error).__name__}: {error}") from None


def _does_not_fit(path: str, what: str, why: str) -> CheckpointFileError:
    return CheckpointFileError(
        f"{path!r} does not fit this run's {what} ({why}). Was it written by another model or "
        "optimizer? Resume from a checkpoint of this run."
    )


def load_rng_state(path: str) -> dict:
    state = safe_torch_load(path)
    problem = rng_state_problem(state)
    if problem is not None:
        raise CheckpointFileError(f"{path!r} is not an RNG state a Trainer saved: {problem}.")
    return state
