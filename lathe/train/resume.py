"""The Trainer's side of checkpoints: what goes into checkpoint-N, exact resume from one, the best
model, rotation, and what save_model / save_state / save_metrics write. Trainer's methods of those
names (trainer.py) call these functions."""
from __future__ import annotations

import json
import logging
import os

import torch

from lathe.train import checkpoint as ckpt
from lathe.train import weights as weights_io
from lathe.train import fsdp, loading, rotation, runtime, snapshot
from lathe.train.evaluation import is_better
from lathe.train.state import ExportableState, TrainerState

logger = logging.getLogger(__name__)

# Arguments that change the data order or step arithmetic: a resume with different values is
# not the interrupted run any more, so the user hears about it.
_ARGS_THAT_CHANGE_THE_RUN = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "num_train_epochs", "seed", "data_seed", "train_sampling_strategy")


# ----- saving -----


def save_model(trainer, output_dir: str | None = None, _internal_call: bool = False) -> None:
    """Weights (safetensors; save_pretrained for transformers/peft models), the processing
    class, and the training arguments (training_args.bin like transformers, plus readable JSON)."""
    args, model = trainer.args, trainer.model
    output_dir = output_dir if output_dir is not None else args.output_dir
    weights = None
    engine = trainer._zero_engine
    if fsdp.is_sharded(model) or engine is not None:
        # a collective: every rank sends, rank 0 gets the full tensors
        weights = fsdp.gather_state(model)[0] if fsdp.is_sharded(model) else _zero_module().full_state_dict(engine)
        if args.process_index != 0:
            return
    elif not args.should_save:
        return
    try:
        os.makedirs(output_dir, exist_ok=True)
        weights_io.save_model_weights(model, output_dir, state_dict=weights)
        save_processing_class(trainer.processing_class, output_dir)
        torch.save(args, os.path.join(output_dir, ckpt.TRAINING_ARGS_NAME))
        with open(os.path.join(output_dir, ckpt.TRAINING_ARGS_JSON), "w", encoding="utf-8") as f:
            f.write(args.to_json_string())
    except Exception as error:
        if _internal_call:
            raise  # inside a checkpoint save, which explains the error itself
        # torch and safetensors report a full disk without naming the path or the disk.
        raise ckpt.explain_save_error(error, os.path.join(output_dir, ckpt.WEIGHTS_NAME),
                                      f"Saving the model to {output_dir!r} failed.") from error


def save_processing_class(processing_class, output_dir: str) -> None:
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(output_dir)


def save_checkpoint(trainer, model, trial=None) -> None:
    """checkpoint-<global_step>, written into a staging folder and published by one rename;
    rotation deletes older checkpoints only after that rename. In a single process the files
    are written from a copy of the state, flushed and renamed while the next training steps run
    (lathe.train.snapshot, lathe.train.commit)."""
    args, state = trainer.args, trainer.state
    commits = trainer._checkpoint_commits
    commits.wait()  # the previous checkpoint is published before anything looks for it
    output_dir = args.output_dir
    final_path = ckpt.checkpoint_path(output_dir, state.global_step)
    if state.best_global_step is not None:
        best_path = ckpt.checkpoint_path(output_dir, state.best_global_step)
        if state.best_global_step == state.global_step or os.path.isdir(best_path):
            # transformers' form (output_dir/checkpoint-N), so user code can open it; a moved
            # output folder still finds it by folder name (see find_best_checkpoint).
            state.best_model_checkpoint = best_path
    state.stateful_callbacks = TrainerState(stateful_callbacks=stateful_callbacks(trainer)).stateful_callbacks
    main = args.should_save
    best = state.best_model_checkpoint
    # FSDP2: full weights and optimizer state gathered from the shards to rank 0 (every rank takes part).
    gathered = fsdp.gather_state(trainer.model, None if args.save_only_model else trainer.optimizer) if fsdp.is_sharded(trainer.model) else None
    engine = trainer._zero_engine  # DeepSpeed writes the optimizer state, each rank its partition
    if _zero_module().partitions_weights(engine):
        gathered = (_zero_module().full_state_dict(engine), None)

    def rotate():
        rotation.rotate_checkpoints(output_dir, args.save_total_limit, find_best_checkpoint(best, output_dir), newest=final_path)

    # One process: the files are written from a copy of the state by the commit thread. Several
    # processes write in the loop (their barriers cannot run in a thread), as does a subclass
    # that overrides save_model (its override must see the checkpoint's folder).
    background = (args.world_size == 1 and gathered is None and engine is None and type(trainer).save_model is save_model
                  and snapshot.copy_fits_in_memory(trainer.model, trainer.optimizer))
    optimizer, scheduler = (None, None) if engine is not None else (trainer.optimizer, trainer.lr_scheduler)
    contents = snapshot.capture(trainer.model, optimizer, scheduler, trainer.scaler, state, args, main=main,
                                with_training_state=not args.save_only_model, copy_state=background)
    if gathered is not None and main:
        contents.model_state, contents.args = gathered[0], args
        if gathered[1] is not None:
            contents.optimizer = gathered[1]
    rng_name = ckpt.rng_file_name(args.process_index, args.world_size)
    with ckpt.atomic_checkpoint(final_path, is_main_process=main, barrier=runtime.barrier,
                                committer=commits if background else None, after_commit=rotate,
                                write=lambda folder: contents.write(trainer.model, folder, rng_name)) as staging:
        if engine is not None and not args.save_only_model:
            _zero_module().save(engine, staging, state.global_step, exclude_frozen=_has_frozen_parameters(trainer.model))
        if main and (background or gathered is not None):
            save_processing_class(trainer.processing_class, staging)
        elif main:
            trainer.save_model(staging, _internal_call=True)
    if trainer.callback_handler.has_listeners("on_save"):
        commits.wait()  # on_save may open the checkpoint, as under transformers


def stateful_callbacks(trainer) -> list:
    """The callbacks (and the TrainerControl) whose state a checkpoint carries."""
    return [cb for cb in trainer.callback_handler.callbacks + [trainer.control] if isinstance(cb, ExportableState)]


def best_checkpoint_path(trainer) -> str | None:
    """The best checkpoint's folder now (found again if the output folder moved), or None."""
    return find_best_checkpoint(trainer.state.best_model_checkpoint, trainer.args.output_dir)


def final_rotation(args, best: str | None) -> None:
    """With save_total_limit=1 and a distinct best checkpoint, two were kept during training
    (so the newest could resume); at the end only the best remains, as in transformers."""
    if args.should_save and best is not None and args.save_total_limit == 1 and os.path.isdir(best):
        rotation.keep_only(args.output_dir, best)


# ----- best model -----


def update_best_metric(args, state, metrics: dict) -> bool:
    """Record `metrics` as the best so far when they are; True when they are."""
    name = args.metric_for_best_model
    if name is None:
        return False
    key = name if name.startswith("eval_") else f"eval_{name}"
    if key not in metrics:
        raise KeyError(
            f"metric_for_best_model={name!r} was not returned by evaluation (got {sorted(metrics)}). "
            "Set metric_for_best_model to one of those, or return it from compute_metrics."
        )
    value = metrics[key]
    if is_better(value, state.best_metric, args.greater_is_better):
        state.best_metric = value
        state.best_global_step = state.global_step
        return True
    return False


def load_best_model(trainer) -> None:
    path = trainer._best_checkpoint_path()
    if path is None or not os.path.isdir(path):
        logger.warning("load_best_model_at_end: the best checkpoint %r no longer exists; keeping the last weights.", trainer.state.best_model_checkpoint)
        return
    logger.info("Loading the best model from %s (%s = %s).", path, trainer.args.metric_for_best_model, trainer.state.best_metric)
    load_weights(trainer.model, trainer.args, path)


def load_weights(model, args, path: str, optimizer=None, optimizer_file: str | None = None) -> None:
    """The checkpoint's weights (and optimizer state) into the model. Sharded by FSDP2: rank 0
    reads the full tensors and every rank receives its shards, so a checkpoint written by any
    number of processes (or one) loads under any other."""
    if not fsdp.is_sharded(model):
        weights_io.load_model_weights(model, path)
        if optimizer_file is not None:
            loading.load_state_into(optimizer, optimizer_file, "optimizer", map_location=args.device)
        return
    if hasattr(model, "load_saved_weights"):
        raise NotImplementedError(f"Loading {type(model).__name__} weights from {path} into an FSDP2-sharded "
                                  "model is not supported yet (its files are split): resume without fsdp.")
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
            raise ValueError(f"resume_from_checkpoint=True, but {args.output_dir!r} holds no complete checkpoint-N folder.")
    else:
        path = str(resume_from_checkpoint)
        if not os.path.isdir(path):
            raise ValueError(f"resume_from_checkpoint={path!r} is not a folder.")
        problem = ckpt.checkpoint_problem(path)
        if problem is not None:
            raise ValueError(f"Checkpoint {path!r} is incomplete or corrupt (interrupted while saving?): {problem}. "
                             "Resume from an earlier one.")
    written_by_deepspeed = _zero_module().has_checkpoint(path)
    if args.deepspeed and not written_by_deepspeed:
        raise ValueError(f"Checkpoint {path!r} was not written under deepspeed (it has no DeepSpeed `latest` file and "
                         "global_stepN/ folder): resume it without deepspeed, or start a new run from its weights.")
    if written_by_deepspeed and not args.deepspeed:
        raise ValueError(f"Checkpoint {path!r} was written under deepspeed: its optimizer state is in DeepSpeed's "
                         "global_stepN/ files. Resume it with the same deepspeed config, or start a new run from its weights.")
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
        _zero_module().load(trainer._zero_engine, path, strict=not _has_frozen_parameters(trainer.model))
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
        logger.warning("Checkpoint %s has no RNG state; dropout and shuffling after resume will differ from the original run.", path)
    saved = TrainerState.load_from_json(os.path.join(path, ckpt.TRAINER_STATE_NAME))
    batch_size = trainer._train_batch_size
    _warn_about_changed_arguments(args, path, saved, plan, batch_size)
    # Keep the step counts of this run (they depend on the current arguments) and the
    # process flags; take everything else from the checkpoint.
    for name in ("max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps", "is_local_process_zero", "is_world_process_zero"):
        setattr(saved, name, getattr(trainer.state, name))
    saved.train_batch_size = batch_size
    saved.best_model_checkpoint = find_best_checkpoint(saved.best_model_checkpoint, os.path.dirname(os.path.normpath(path)), args.output_dir)
    if args.restore_callback_states_from_checkpoint:
        _restore_callback_states(stateful_callbacks(trainer), saved)
    if saved.global_step >= plan.max_steps:
        logger.warning(
            "Checkpoint %s is already at step %d of max_steps=%d: there is nothing left to train. Raise "
            "max_steps or num_train_epochs to continue training.", path, saved.global_step, plan.max_steps,
        )
    return saved, rng_state


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
            "the uninterrupted run: %s.", path, "; ".join(changed),
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
        logger.info("Checkpoint %s was written by %d processes, resumed under %d with the same global batch (%d).", path, before, now, new_global)
        return [entry for entry in changed if not entry.startswith(("per_device_train_batch_size:", "train batch size:"))]
    return changed + [f"processes: {before} -> {now}, so the global batch (per-device batch x processes) is {new_global}, was {old_global}"]


def _restore_callback_states(callbacks: list, saved: TrainerState) -> None:
    states = saved.stateful_callbacks or {}
    for callback in callbacks:
        entry = states.get(type(callback).__name__)
        if entry is None:
            continue
        if isinstance(entry, list):  # several callbacks of one class: restore in order
            entry = entry.pop(0) if entry else None
            if entry is None:
                continue
        callback.__dict__.update(type(callback).from_state(entry).__dict__)


def _zero_module():
    from lathe.train.integrations import deepspeed_zero

    return deepspeed_zero


def _has_frozen_parameters(model) -> bool:
    return any(not parameter.requires_grad for parameter in model.parameters())


def _read_json_object(path: str) -> dict | None:
    """training_args.json, only compared for a warning: unreadable, it is reported and skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        logger.warning("Cannot read %s (%s): the arguments of the run that wrote it are not compared with these.", path, error)
        return None
    return data if isinstance(data, dict) else None


def find_best_checkpoint(best: str | None, *folders: str) -> str | None:
    """best_model_checkpoint as saved (output_dir/checkpoint-N, or only "checkpoint-N" from older
    lathe versions), found again after the output folder moved or the run resumed into another
    output_dir: first by its folder name in `folders` (the run that wrote it first), then as given."""
    if best is None:
        return None
    name = os.path.basename(os.path.normpath(best))
    for folder in folders:
        candidate = os.path.join(folder, name)
        if os.path.isdir(candidate):
            return candidate
    return best
