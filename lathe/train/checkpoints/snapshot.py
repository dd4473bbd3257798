"""What a checkpoint holds, taken between two steps: either live references (written at once) or a
copy (written by the commit thread while training goes on).

Serializing weights and optimizer state is most of a save (for the LM bench job ~10 ms of ~13). With
a copy, the loop only pays for the copy (a memcpy of the state, ~1 ms there) and the files are
written, flushed and published in lathe.train.checkpoints.commit's thread. The copy keeps aliasing (tied
weights stay one tensor, so the files are the same as a synchronous save's) and does not copy what
training cannot change: parameters with requires_grad=False (a frozen base under LoRA or freeze
training) are referenced, not copied.
"""

from __future__ import annotations

import copy
import logging
import os
import weakref
from dataclasses import dataclass

import torch

from lathe.train.checkpoints import layout as ckpt
from lathe.train.checkpoints import weights as weights_io
from lathe.train.seed import capture_rng_state

logger = logging.getLogger(__name__)

# A copy larger than this share of the free memory is not worth the risk of running out of it:
# the save is then written in the loop, as under several processes.
MAX_SHARE_OF_FREE_MEMORY = 0.5


@dataclass
class CheckpointContents:
    """None means: not this process's to write (or, for the weights and arguments, written by
    Trainer.save_model in the loop)."""

    model_state: dict | None
    args: object | None  # TrainingArguments: training_args.bin and .json (read-only during training)
    optimizer: dict | None
    scheduler: dict | None
    scaler: dict | None
    rng: dict | None
    trainer_state: str | None  # trainer_state.json

    def write(self, model, folder: str, rng_name: str) -> None:
        """Write into `folder` (the staging folder), in the order of a transformers save. The
        processing class is not here: the loop saves it, since the loop may be using it (padding)."""
        if self.model_state is not None:
            weights_io.save_model_weights(model, folder, state_dict=self.model_state)
            torch.save(self.args, os.path.join(folder, ckpt.TRAINING_ARGS_NAME))
            with open(os.path.join(folder, ckpt.TRAINING_ARGS_JSON), "w", encoding="utf-8") as f:
                f.write(self.args.to_json_string())
        for name, state in (
            (ckpt.OPTIMIZER_NAME, self.optimizer),
            (ckpt.SCHEDULER_NAME, self.scheduler),
            (ckpt.SCALER_NAME, self.scaler),
            (rng_name, self.rng),
        ):
            if state is not None:
                torch.save(state, os.path.join(folder, name))
        if self.trainer_state is not None:
            with open(os.path.join(folder, ckpt.TRAINER_STATE_NAME), "w", encoding="utf-8") as f:
                f.write(self.trainer_state)


def capture(
    model, optimizer, lr_scheduler, scaler, state, args, *, main: bool, with_training_state: bool, copy_state: bool
) -> CheckpointContents:
    """The checkpoint's contents now. copy_state=False: references to the live state, to be written
    at once, and the weights and arguments left to Trainer.save_model; copy_state=True: a copy of
    everything, to be written later by another thread."""
    memo: dict = {}
    take = (lambda value: _copy_tensors(value, memo)) if copy_state else (lambda value: value)
    contents = CheckpointContents(None, None, None, None, None, None, None)
    if main and copy_state:
        contents.model_state = {
            name: tensor if frozen else _copy_tensor(tensor, memo) for name, tensor, frozen in _model_entries(model)
        }
        contents.args = args
    if with_training_state:
        if main:
            # None: kept elsewhere (DeepSpeed writes its own optimizer and scheduler files)
            contents.optimizer = take(optimizer.state_dict()) if optimizer is not None else None
            contents.scheduler = take(lr_scheduler.state_dict()) if lr_scheduler is not None else None
            contents.scaler = take(scaler.state_dict()) if scaler is not None else None
        contents.rng = capture_rng_state()  # a copy already; every rank keeps its own stream
    if main:
        contents.trainer_state = state.to_json_string()
    return contents


_fits_by_optimizer: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def copy_fits_in_memory(model, optimizer) -> bool:
    """Whether a copy of the trainable weights, buffers and optimizer state fits comfortably in the
    free memory. Asked once per optimizer: after its first step the state's size stays the same."""
    known = _fits_by_optimizer.get(optimizer)
    if known is not None and known[0] == len(optimizer.state):
        return known[1]
    free = _free_memory_bytes()
    needed = sum(t.numel() * t.element_size() for _n, t, frozen in _model_entries(model) if not frozen)
    for values in optimizer.state.values():
        needed += sum(v.numel() * v.element_size() for v in values.values() if torch.is_tensor(v))
    fits = free is None or needed <= MAX_SHARE_OF_FREE_MEMORY * free
    if not fits:
        logger.info(
            "Checkpoint state (%.1f GB) is large against free memory (%.1f GB): saving in the training loop "
            "instead of from a copy in the background.",
            needed / 1e9,
            free / 1e9,
        )
    _fits_by_optimizer[optimizer] = (len(optimizer.state), fits)
    return fits


def _model_entries(model):
    """(name, tensor, frozen) for model.state_dict(); frozen: a parameter training does not change."""
    frozen_ids = {id(p) for p in model.parameters() if not p.requires_grad}
    for name, tensor in model.state_dict(keep_vars=True).items():
        yield name, tensor.detach(), id(tensor) in frozen_ids


def _copy_tensors(value, memo: dict):
    if torch.is_tensor(value):
        return _copy_tensor(value, memo)
    if isinstance(value, dict):
        return {k: _copy_tensors(v, memo) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_tensors(v, memo) for v in value)
    return copy.deepcopy(value)


def _copy_tensor(tensor: torch.Tensor, memo: dict) -> torch.Tensor:
    """A CPU copy; the same view seen twice (tied weights) gives one copy, so safetensors and
    save_pretrained see the same sharing and write the same files as from the live model."""
    tensor = tensor.detach()
    key = (
        tensor.untyped_storage().data_ptr(),
        tensor.device,
        tensor.dtype,
        tensor.storage_offset(),
        tensor.shape,
        tensor.stride(),
    )
    copied = memo.get(key)
    if copied is None:
        copied = memo[key] = tensor.to("cpu", copy=True)
    return copied


def _free_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
