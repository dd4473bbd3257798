"""Exact resume from checkpoint-N: which checkpoint (resume_from_checkpoint), whether it can resume this
run, and loading every state back (weights, optimizer, scheduler, scaler, TrainerState, callbacks),
with the RNG state returned for the loop to restore at the right point; loading the best model at the
end. What a checkpoint holds and how it is written is saving.py."""

from __future__ import annotations

import json
import logging
import os

from lathe.train.checkpoints import layout as ckpt
from lathe.train.checkpoints import loading
from lathe.train.checkpoints import weights as weights_io
from lathe.train.parallel import fsdp
from lathe.train.saving import find_best_checkpoint, has_frozen_parameters, stateful_callbacks, zero_module
from lathe.train.state import TrainerState

logger = logging.getLogger(__name__)

# Arguments that change the data order or step arithmetic: a resume with different values is
# not the interrupted run any more, so the user hears about it.
_ARGS_THAT_CHANGE_THE_RUN = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    "num_train_epochs",
    "seed",
    "data_seed",
    "train_sampling_strategy",
)


def load_best_model(trainer) -> None:
    path = trainer._best_checkpoint_path()
    if path is None or not os.path.isdir(path):
        logger.warning(
            "load_best_model_at_end: the best checkpoint %r no longer exists; keeping the last weights.",
            trainer.state.best_model_checkpoint,
        )
        return
    logger.info(
        "Loading the best model from %s (%s = %s).", path, trainer.args.metric_for_best_model, trainer.state.best_metric
    )
    trainer._load_from_checkpoint(path)


def load_from_checkpoint(trainer, resume_from_checkpoint: str, model=None) -> None:
    """transformers' Trainer._load_from_checkpoint: the checkpoint's weights into `model` (the Trainer's)."""
    load_weights(model if model is not None else trainer.model, trainer.args, resume_from_checkpoint)


def load_weights(model, args, path: str, optimizer=None, optimizer_file: str | None = None) -> None:
    """The checkpoint's weights (and optimizer state) into the model. Sharded by FSDP2: rank 0
    reads the full tensors and every rank receives its shards, so a checkpoint written by any
    number of processes (or one) loads under any other."""
    if not fsdp.is_sharded(model):
        weights_io.load_model_weights(model, path)
        if optimizer_file is not None:
            from lathe.train.optim.optimizers import (
                optimizer_state_classes,
            )  # optimizers of optional packages (GaLore, ...)

            loading.load_state_into(
                optimizer,
                optimizer_file,
                "optimizer",
                map_location=args.device,
                allowed=optimizer_state_classes(optimizer),
            )
        return
    if hasattr(model, "load_saved_weights"):
        raise NotImplementedError(
            f"Loading {type(model).__name__} weights from {path} into an FSDP2-sharded "
            "model is not supported yet (its files are split): resume without fsdp."
        )
    first = args.process_index == 0
    adapter = os.path.isfile(os.path.join(path, ckpt.ADAPTER_WEIGHTS_NAME)) and hasattr(model, "load_adapter")
    weights = {}
    if first:
        weights = fsdp.adapter_weights_by_name(model, path) if adapter else weights_io.read_model_weights(path)
    optimizer_state = loading.safe_torch_load(optimizer_file) if first and optimizer_file is not None else {}
    missing, unexpected = fsdp.load_state(model, weights, optimizer if optimizer_file else None, optimizer_state)
    if not adapter:  # an adapter checkpoint leaves the (frozen) base weights as they are
        weights_io.check_missing(model, missing, unexpected, path, strict=True)


# ----- resuming -----


def resolve_resume_path(args, resume_from_checkpoint) -> str | None:
    """The checkpoint folder train(resume_from_checkpoint=...) continues from, checked; None for a new run."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        ckpt.remove_staging_leftovers(args.output_dir)
        path = ckpt.get_last_checkpoint(args.output_dir)
        if path is None:
            raise ValueError(
                f"No valid checkpoint found in output directory ({args.output_dir}): resume_from_checkpoint=True, "
                "but it holds no complete checkpoint-N folder."
            )
    else:
        path = str(resume_from_checkpoint)
        if not os.path.isdir(path):
            raise ValueError(
                f"Can't find a valid checkpoint at {path}: resume_from_checkpoint={path!r} is not a folder."
            )
        problem = ckpt.checkpoint_problem(path)
        if problem is not None:
            raise ValueError(
                f"Checkpoint {path!r} is incomplete or corrupt (interrupted while saving?): {problem}. "
                "Resume from an earlier one."
            )
    written_by_deepspeed = zero_module().has_checkpoint(path)
    if args.deepspeed and not written_by_deepspeed:
        raise ValueError(
            f"Checkpoint {path!r} was not written under deepspeed (it has no DeepSpeed `latest` file and "
            "global_stepN/ folder): resume it without deepspeed, or start a new run from its weights."
        )
    if written_by_deepspeed and not args.deepspeed:
        raise ValueError(
            f"Checkpoint {path!r} was written under deepspeed: its optimizer state is in DeepSpeed's "
            "global_stepN/ files. Resume it with the same deepspeed config, or start a new run from its weights."
        )
    if not written_by_deepspeed and not os.path.isfile(os.path.join(path, ckpt.OPTIMIZER_NAME)):
        raise ValueError(
            f"Checkpoint {path!r} has no optimizer state (saved with save_only_model=True?), so training cannot "
            "resume exactly. Load its weights into the model (e.g. from_pretrained) and start a new run instead."
        )
    return path


def restore_batch_size(args, path: str | None) -> int | None:
    """auto_find_batch_size: a resumed run uses the batch size the search settled on."""
    if path is None or not args.auto_find_batch_size:
        return None
    return TrainerState.load_from_json(os.path.join(path, ckpt.TRAINER_STATE_NAME)).train_batch_size


def load_checkpoint(trainer, path: str, plan) -> tuple[TrainerState, dict | None]:
    """Load weights, optimizer, scheduler, scaler and callback states from `path`; return the
    TrainerState to continue with and the RNG state, which the caller restores only once the epoch's
    batch iterator exists (see Trainer._epoch_batches for why there)."""
    args = trainer.args
    if trainer._zero_engine is not None:  # weights, optimizer partitions and scheduler
        zero_module().load(trainer._zero_engine, path, strict=not has_frozen_parameters(trainer.model))
    else:
        load_weights(trainer.model, args, path, trainer.optimizer, os.path.join(path, ckpt.OPTIMIZER_NAME))
    scheduler_file = os.path.join(path, ckpt.SCHEDULER_NAME)
    if os.path.isfile(scheduler_file):
        loading.load_state_into(trainer.lr_scheduler, scheduler_file, "learning-rate scheduler")
    scaler_file = os.path.join(path, ckpt.SCALER_NAME)
    if trainer.scaler is not None and os.path.isfile(scaler_file):
        loading.load_state_into(trainer.scaler, scaler_file, "gradient scaler")
    # This rank's stream; under a different number of processes than wrote it, one process's or rank 0's.
    candidates = (ckpt.rng_file_name(args.process_index, args.world_size), "rng_state.pth", "rng_state_0.pth")
    rng_file = next((os.path.join(path, name) for name in candidates if os.path.isfile(os.path.join(path, name))), None)
    rng_state = loading.load_rng_state(rng_file) if rng_file is not None else None
    if rng_state is None:
        logger.warning(
            "Checkpoint %s has no RNG state; dropout and shuffling after resume will differ from the original run.",
            path,
        )
    saved = TrainerState.load_from_json(os.path.join(path, ckpt.TRAINER_STATE_NAME))
    batch_size = trainer._train_batch_size
    compare_trainer_and_checkpoint_args(args, saved)
    _warn_about_changed_arguments(args, path, saved, plan, batch_size)
    # Keep the step counts of this run (they depend on the current arguments) and the
    # process flags; take everything else from the checkpoint.
    for name in (
        "max_steps",
        "num_train_epochs",
        "logging_steps",
        "eval_steps",
        "save_steps",
        "is_local_process_zero",
        "is_world_process_zero",
    ):
        setattr(saved, name, getattr(trainer.state, name))
    saved.train_batch_size = batch_size
    saved.best_model_checkpoint = find_best_checkpoint(
        saved.best_model_checkpoint, os.path.dirname(os.path.normpath(path)), args.output_dir
    )
    if args.restore_callback_states_from_checkpoint:
        _restore_callback_states(stateful_callbacks(trainer), saved)
    if saved.global_step >= plan.max_steps:
        logger.warning(
            "Checkpoint %s is already at step %d of max_steps=%d: there is nothing left to train. Raise "
            "max_steps or num_train_epochs to continue training.",
            path,
            saved.global_step,
            plan.max_steps,
        )
    return saved, rng_state


def compare_trainer_and_checkpoint_args(training_args, trainer_state) -> None:
    """transformers.trainer_utils' check, with its lines, through the Trainer's logger: logging/eval/save steps
    and the per-device batch of the arguments against those trainer_state.json stored. (lathe's own warning
    below also names the settings that change the trained result.)"""
    lines = [
        f"\n\t{name}: {getattr(training_args, name)} (from args) != {getattr(trainer_state, name)} (from trainer_state.json)"
        for name in ("logging_steps", "eval_steps", "save_steps")
        if None not in (getattr(training_args, name, None), getattr(trainer_state, name, None))
        and getattr(training_args, name) != getattr(trainer_state, name)
    ]
    saved_batch = (trainer_state.train_batch_size or 0) // max(1, training_args.n_gpu)
    if trainer_state.train_batch_size is not None and training_args.per_device_train_batch_size != saved_batch:
        lines.append(
            f"\n\tper_device_train_batch_size: {training_args.per_device_train_batch_size} (from args) != "
            f"{saved_batch} (from trainer_state.json)"
        )
    if lines:
        logging.getLogger("lathe.train.trainer").warning(
            "Warning: The following arguments do not match the ones in the `trainer_state.json` within the "
            "checkpoint directory: " + "".join(lines)
        )


def _warn_about_changed_arguments(args, path: str, saved: TrainerState, plan, batch_size: int) -> None:
    changed = []
    args_file = os.path.join(path, ckpt.TRAINING_ARGS_JSON)
    old = _read_json_object(args_file) if os.path.isfile(args_file) else None
    if old is not None:
        for name in _ARGS_THAT_CHANGE_THE_RUN:
            new_value = getattr(args, name, None)
            new_value = getattr(new_value, "value", new_value)
            if name in old and old[name] != new_value:
                changed.append(f"{name}: {old[name]} -> {new_value}")
    if saved.train_batch_size is not None and saved.train_batch_size != batch_size:
        changed.append(f"train batch size: {saved.train_batch_size} -> {batch_size}")
    changed = _compare_process_counts(args, path, saved, changed, batch_size)
    if saved.max_steps and saved.max_steps != plan.max_steps:
        changed.append(f"total steps: {saved.max_steps} -> {plan.max_steps} (dataset size or epochs changed?)")
    if changed:
        logger.warning(
            "Resuming from %s with settings that differ from the run that wrote it, so the result will not equal "
            "the uninterrupted run: %s.",
            path,
            "; ".join(changed),
        )


def _compare_process_counts(args, path: str, saved: TrainerState, changed: list[str], batch_size: int) -> list[str]:
    """A checkpoint resumes under another number of processes (DDP checkpoints and FSDP's gathered
    ones hold full tensors). What must match is the global batch, per-device batch x processes: then
    every update sees the samples the interrupted run's would have, and a changed per-device batch is
    no news. RNG streams are per rank, so randomness (dropout) after resume differs either way."""
    before = len([name for name in os.listdir(path) if name.startswith("rng_state_") and name.endswith(".pth")]) or 1
    now = args.world_size
    if before == now or saved.train_batch_size is None:
        return changed
    old_global, new_global = saved.train_batch_size * before, batch_size * now
    if old_global == new_global:
        logger.info(
            "Checkpoint %s was written by %d processes, resumed under %d with the same global batch (%d).",
            path,
            before,
            now,
            new_global,
        )
        return [
            entry for entry in changed if not entry.startswith(("per_device_train_batch_size:", "train batch size:"))
        ]
    return changed + [
        f"processes: {before} -> {now}, so the global batch (per-device batch x processes) is {new_global}, was {old_global}"
    ]


def _restore_callback_states(callbacks: list, saved: TrainerState) -> None:
    states = saved.stateful_callbacks or {}
    present = {type(callback).__name__ for callback in callbacks}
    not_found = [name for name in states if name not in present]
    if not_found:  # the Trainer's logger, in transformers' words
        logging.getLogger("lathe.train.trainer").warning(
            "Checkpoint included callbacks not included in current configuration. Ignoring. (%s)" % ", ".join(not_found)
        )
    for callback in callbacks:
        entry = states.get(type(callback).__name__)
        if entry is None:
            continue
        if isinstance(entry, list):  # several callbacks of one class: restore in order
            entry = entry.pop(0) if entry else None
            if entry is None:
                continue
        callback.__dict__.update(type(callback).from_state(entry).__dict__)


def _read_json_object(path: str) -> dict | None:
    """training_args.json, only compared for a warning: unreadable, it is reported and skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        logger.warning(
            "Cannot read %s (%s): the arguments of the run that wrote it are not compared with these.", path, error
        )
        return None
    return data if isinstance(data, dict) else None
