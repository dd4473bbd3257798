"""Update steps: how many there are, which micro-batches form each one, where a resumed run
starts, and the loss-normalisation denominator (num_items_in_batch). The step maths lives here only."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice

import torch

from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.parallel import distributed


@dataclass(frozen=True)
class TrainingPlan:
    """The length of a run, fixed before the first step."""

    batches_per_epoch: int | None  # micro-batches; None for an iterable dataset
    updates_per_epoch: int | None  # ceil(batches_per_epoch / gradient_accumulation_steps)
    max_steps: int
    num_train_epochs: int  # the loop's epoch bound (ceil of a fractional num_train_epochs)
    num_train_samples: int | None


def plan_training(args, batches_per_epoch: int | None, dataset_size: int | None, batch_size: int) -> TrainingPlan:
    """Step arithmetic: updates per epoch = ceil(batches / accumulation); max_steps overrides
    epochs (cycling the data); a fractional num_train_epochs stops mid-epoch."""
    accumulation = args.gradient_accumulation_steps
    if batches_per_epoch is not None:
        if batches_per_epoch == 0:
            raise ValueError(
                "The training dataloader is empty: the train dataset has no examples, or fewer than "
                "per_device_train_batch_size with dataloader_drop_last=True."
            )
        # A remainder of micro-batches still makes an update (a short last window), as in transformers:
        # dropping it would leave examples untrained every epoch.
        updates_per_epoch = max(math.ceil(batches_per_epoch / accumulation), 1)
        if args.max_steps > 0:
            max_steps = args.max_steps
            num_epochs = math.ceil(max_steps / updates_per_epoch)
            num_samples = max_steps * batch_size * accumulation
        else:
            max_steps = math.ceil(args.num_train_epochs * updates_per_epoch)
            num_epochs = math.ceil(args.num_train_epochs)
            num_samples = int(dataset_size * args.num_train_epochs) if dataset_size is not None else None
        return TrainingPlan(batches_per_epoch, updates_per_epoch, max_steps, num_epochs, num_samples)
    if args.max_steps > 0:
        # An iterable dataset has no length: run max_steps updates, restarting it as often as needed.
        return TrainingPlan(None, None, args.max_steps, sys.maxsize, args.max_steps * batch_size * accumulation)
    raise ValueError(
        "The train dataset has no length (an IterableDataset), so the number of steps is unknown: "
        "set TrainingArguments.max_steps to a positive number."
    )


@dataclass(frozen=True)
class ResumePosition:
    epoch: int  # the epoch to continue
    updates_done_in_epoch: int  # update steps of that epoch already taken
    batches_to_skip: int  # micro-batches of that epoch to skip without loading them


def resume_position(
    global_step: int, plan: TrainingPlan, accumulation: int, ignore_data_skip: bool, epoch: float | None = None
) -> ResumePosition:
    """Where a run that has taken `global_step` updates (and reached TrainerState.epoch `epoch`)
    continues. Only the last window of an epoch may be short, so whole epochs and windows convert
    exactly to micro-batches."""
    if global_step >= plan.max_steps:
        # Nothing left to train: start past the last epoch, so the loop takes no step at all
        # (skipping to the epoch of global_step would train on the rest of that epoch).
        return ResumePosition(plan.num_train_epochs, 0, 0)
    if global_step == 0 or plan.updates_per_epoch is None:
        # An iterable dataset has no epoch length, so the pass over it and the batches read in that
        # pass come from the state's epoch, pass + batches / (max_steps * accumulation) (the loop's
        # definition, and transformers'): global_step * accumulation would be wrong after the first
        # pass, whose last window may be short. Iterable datasets cannot seek; the loop reads the
        # skipped batches instead (see skip_batches in data/epochs.py).
        if ignore_data_skip or global_step == 0:
            return ResumePosition(0, 0, 0)
        if epoch is None:
            return ResumePosition(0, 0, global_step * accumulation)
        whole = int(epoch)
        return ResumePosition(whole, 0, round((epoch - whole) * plan.max_steps * accumulation))
    # Every window but an epoch's last is full, and a checkpoint is only taken between updates, so the
    # micro-batches done in the current epoch are exactly updates_done * accumulation.
    epoch, updates_done = divmod(global_step, plan.updates_per_epoch)
    batches = 0 if ignore_data_skip else updates_done * accumulation
    return ResumePosition(epoch, 0 if ignore_data_skip else updates_done, batches)


def update_windows(batches: Iterator, plan: TrainingPlan, accumulation: int, first_update: int) -> Iterator[list]:
    """Group an epoch's micro-batches into update steps. The last window of an epoch holds the
    remainder, so it may be shorter (its loss is scaled by its own size, see normalise_loss)."""
    if plan.batches_per_epoch is None:
        while window := list(islice(batches, accumulation)):
            yield window
        return
    # The window sizes are known before the batches are read: full windows, then the remainder.
    # Taking the windows from the plan (not from whatever the iterator yields) keeps a resumed
    # epoch's windows aligned with the interrupted run's.
    remainder = plan.batches_per_epoch % accumulation or accumulation
    for update in range(first_update, plan.updates_per_epoch):
        size = remainder if update == plan.updates_per_epoch - 1 else accumulation
        window = list(islice(batches, size))
        if not window:
            return
        yield window


def count_label_items(window: list, shift_labels: bool) -> torch.Tensor | None:
    """The loss-normalisation denominator: label tokens != -100 over the whole accumulation
    window. Causal LMs predict token t+1 from t, so their first label never counts (shift)."""
    total = None
    for batch in window:
        if not isinstance(batch, Mapping) or batch.get("labels") is None:
            return None
        labels = batch.get("shift_labels")  # already shifted by the collator: every position counts
        if labels is None:
            labels = batch["labels"]
            if not torch.is_tensor(labels):
                return None
            if shift_labels:
                labels = labels[..., 1:]
        # Kept a tensor (no .item()): reading it would force a device sync on every update.
        count = labels.ne(IGNORE_INDEX).sum()
        total = count if total is None else total + count
    return total


def count_window_items(window: list, counts_items: bool, shift_labels: bool, device, across_ranks: bool):
    """The loss denominator of the whole window (count_label_items): the label tokens of all its
    micro-batches, so that k micro-batches of b examples train as one batch of k*b. counts_items: the loss
    divides by a count (the model takes loss kwargs, or a compute_loss_func is set); else None, and each
    loss is a mean of its own batch. across_ranks (average_tokens_across_devices): summed over ranks, so
    every rank divides by the global count (loss_scale then undoes DDP's average over ranks)."""
    if not counts_items:
        return None
    num_items = count_label_items(window, shift_labels)
    if torch.is_tensor(num_items) and device.type == "cuda" and num_items.device != device:
        # Counted on the host batch; the loss would copy it over with a blocking .to(device), a host sync on
        # every update (torch.cuda.set_sync_debug_mode finds it). A non-blocking copy queues behind the step.
        num_items = num_items.to(device, non_blocking=True)
    if num_items is not None and across_ranks:
        num_items = distributed.sum_across_ranks(num_items, device)  # unchanged in one process
    return num_items


def loss_scale(counted: bool, across_ranks: bool, loss_is_scaled_for_ga: bool | None) -> tuple[bool, int]:
    """training_step's decision for normalise_loss: (whether the loss is already divided by the window's
    label tokens, the factor of ranks it is scaled by). counted: a num_items_in_batch reached a loss that
    divides by it; across_ranks: that count was summed over ranks; loss_is_scaled_for_ga: a Trainer's
    own answer (None: the count decides)."""
    world_scale = distributed.world_size() if counted and across_ranks else 1
    by_items = counted if loss_is_scaled_for_ga is None else loss_is_scaled_for_ga
    return by_items, world_scale


def normalise_loss(
    loss: torch.Tensor, window_size: int, normalised_by_items: bool, world_scale: int = 1
) -> torch.Tensor:
    """Make the sum of a window's micro-batch losses equal the loss of the whole window.

    When the model (or compute_loss_func) divided by num_items_in_batch, each micro-batch loss is
    already its share of the window; otherwise each is a mean over its micro-batch, and the mean
    over the window divides by the window's real size (shorter at the end of an epoch).
    Under N processes whose count is summed over all of them (world_scale = N), a rank's loss is
    its share of the global window; DDP averages gradients over ranks, so it is scaled by N (and
    the mean over ranks of what is logged is the global loss)."""
    if normalised_by_items:
        # sum over the window of (micro-batch token-loss sum / window tokens) = the window's mean token
        # loss, exactly. A mean of per-micro-batch means would weigh a micro-batch of 10 label tokens
        # like one of 1,000 (the gradient-accumulation bug transformers fixed in 4.46).
        return loss * world_scale if world_scale != 1 else loss
    if world_scale != 1:  # counted over ranks but divided by the window (a Trainer's loss_is_scaled_for_ga=False)
        loss = loss * world_scale
    # x / 1 is exact, so skipping it changes no bit and saves an op (and its backward) per micro-batch.
    return loss if window_size == 1 else loss / window_size


def count_input_tokens(inputs, mode: str, main_input_name: str = "input_ids") -> int:
    """Tokens for num_input_tokens_seen: all positions ("all") or attention_mask ones ("non_padding")."""
    if not isinstance(inputs, Mapping):
        return 0
    if mode == "non_padding" and inputs.get("attention_mask") is not None:
        return int(inputs["attention_mask"].sum())
    tensor = inputs.get(main_input_name)
    return int(tensor.numel()) if tensor is not None else 0
