"""The Trainer's side of saving: what goes into checkpoint-N (weights, optimizer, scheduler, scaler, RNG,
TrainerState with the callbacks' states) and how it is published (lathe.train.checkpoints.layout: staging folder
and one rename; in one process written by a background thread, lathe.train.checkpoints.commit); save_model; which
checkpoint is the best, and the rotation that keeps it. Resuming from a checkpoint is resume.py."""

from __future__ import annotations

import os

import torch

from lathe.train import runtime
from lathe.train.checkpoints import layout as ckpt
from lathe.train.checkpoints import rotation, snapshot
from lathe.train.checkpoints import weights as weights_io
from lathe.train.evaluation.loop import is_better
from lathe.train.parallel import fsdp
from lathe.train.state import ExportableState, TrainerState


def save_model(trainer, output_dir: str | None = None, _internal_call: bool = False) -> None:
    """Weights (safetensors; save_pretrained for transformers/peft models), the processing
    class, and the training arguments (training_args.bin like transformers, plus readable JSON)."""
    args, model = trainer.args, trainer.model
    output_dir = output_dir if output_dir is not None else args.output_dir
    weights = None
    engine = trainer._zero_engine
    if fsdp.is_sharded(model) or engine is not None:
        # a collective: every rank sends, rank 0 gets the full tensors
        weights = fsdp.gather_state(model)[0] if fsdp.is_sharded(model) else zero_module().full_state_dict(engine)
        if args.process_index != 0:
            return
    elif not args.should_save:
        return
    try:
        trainer._save(output_dir, state_dict=weights)
    except Exception as error:
        if _internal_call:
            raise  # inside a checkpoint save, which explains the error itself
        # torch and safetensors report a full disk without naming the path or the disk.
        raise ckpt.explain_save_error(
            error, os.path.join(output_dir, ckpt.WEIGHTS_NAME), f"Saving the model to {output_dir!r} failed."
        ) from error


def save_files(trainer, output_dir: str | None = None, state_dict=None) -> None:
    """transformers' Trainer._save, the hook save_model calls on the process that writes (a subclass writes its
    own layout here, as sentence-transformers does): weights, processing class, training arguments."""
    args = trainer.args
    output_dir = output_dir if output_dir is not None else args.output_dir
    os.makedirs(output_dir, exist_ok=True)
    weights_io.save_model_weights(trainer.model, output_dir, state_dict=state_dict)
    save_processing_class(trainer.processing_class, output_dir)
    torch.save(args, os.path.join(output_dir, ckpt.TRAINING_ARGS_NAME))
    with open(os.path.join(output_dir, ckpt.TRAINING_ARGS_JSON), "w", encoding="utf-8") as f:
        f.write(args.to_json_string())


def save_processing_class(processing_class, output_dir: str) -> None:
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(output_dir)


def save_checkpoint(trainer, model, trial=None) -> None:
    """checkpoint-<global_step>, written into a staging folder and published by one rename;
    rotation deletes older checkpoints only after that rename. In a single process the files
    are written from a copy of the state, flushed and renamed while the next training steps run
    (lathe.train.checkpoints.snapshot, lathe.train.checkpoints.commit)."""
    args, state, commits = trainer.args, trainer.state, trainer._checkpoint_commits
    if trainer.hp_search_backend is None and trial is None:
        trainer.store_flos()  # as transformers: the checkpoint's total_flos counts every step up to it
    commits.wait()  # the previous checkpoint is published before anything looks for it
    final_path = ckpt.checkpoint_path(args.output_dir, state.global_step)
    _record_best_and_callbacks(trainer)
    best, main, engine = state.best_model_checkpoint, args.should_save, trainer._zero_engine
    gathered = _gather_full_state(trainer)
    # One process: the files are written from a copy of the state by the commit thread. Several
    # processes write in the loop (their barriers cannot run in a thread), as does a subclass
    # that overrides save_model (its override must see the checkpoint's folder).
    background = (
        args.world_size == 1
        and gathered is None
        and engine is None
        and type(trainer).save_model is save_model
        and type(trainer)._save is save_files  # a subclass's own layout is written by its _save, in the loop
        and snapshot.copy_fits_in_memory(trainer.model, trainer.optimizer)
    )
    contents = _contents(trainer, gathered, copy_state=background)

    def rotate():
        rotation.rotate_checkpoints(
            args.output_dir, args.save_total_limit, find_best_checkpoint(best, args.output_dir), newest=final_path
        )

    rng_name = ckpt.rng_file_name(args.process_index, args.world_size)
    with ckpt.atomic_checkpoint(
        final_path,
        is_main_process=main,
        barrier=runtime.barrier,
        committer=commits if background else None,
        after_commit=rotate,
        write=lambda folder: contents.write(trainer.model, folder, rng_name),
    ) as staging:
        if (
            engine is not None and not args.save_only_model
        ):  # DeepSpeed writes the optimizer state, each rank its partition
            zero_module().save(engine, staging, state.global_step, exclude_frozen=has_frozen_parameters(trainer.model))
        if main and (background or gathered is not None):
            save_processing_class(trainer.processing_class, staging)
        elif main:
            trainer.save_model(staging, _internal_call=True)
    if trainer.callback_handler.has_listeners("on_save"):
        commits.wait()  # on_save may open the checkpoint, as under transformers


def _contents(trainer, gathered, copy_state: bool) -> snapshot.CheckpointContents:
    """The files' contents: live references, or a copy for the background writer; the gathered full
    state in place of the shards; DeepSpeed's optimizer and scheduler left to the engine's own files."""
    args, engine, main = trainer.args, trainer._zero_engine, trainer.args.should_save
    optimizer, scheduler = (None, None) if engine is not None else (trainer.optimizer, trainer.lr_scheduler)
    contents = snapshot.capture(
        trainer.model,
        optimizer,
        scheduler,
        trainer.scaler,
        trainer.state,
        args,
        main=main,
        with_training_state=not args.save_only_model,
        copy_state=copy_state,
    )
    if gathered is not None and main:
        contents.model_state, contents.args = gathered[0], args
        if gathered[1] is not None:
            contents.optimizer = gathered[1]
    return contents


def _record_best_and_callbacks(trainer) -> None:
    """What trainer_state.json of this checkpoint says: the best checkpoint's path and the callbacks' states."""
    args, state = trainer.args, trainer.state
    if state.best_global_step is not None:
        best_path = ckpt.checkpoint_path(args.output_dir, state.best_global_step)
        if state.best_global_step == state.global_step or os.path.isdir(best_path):
            # transformers' form (output_dir/checkpoint-N), so user code can open it; a moved
            # output folder still finds it by folder name (see find_best_checkpoint).
            state.best_model_checkpoint = best_path
    state.stateful_callbacks = TrainerState(stateful_callbacks=stateful_callbacks(trainer)).stateful_callbacks


def _gather_full_state(trainer):
    """(full weights, full optimizer state or None) on rank 0 when they are split across ranks (FSDP2
    shards, ZeRO-3 partitions; every rank takes part), else None: the live state is written as it is."""
    args = trainer.args
    if fsdp.is_sharded(trainer.model):
        return fsdp.gather_state(trainer.model, None if args.save_only_model else trainer.optimizer)
    if zero_module().partitions_weights(trainer._zero_engine):
        return zero_module().full_state_dict(trainer._zero_engine), None
    return None


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


def zero_module():
    from lathe.train.parallel import deepspeed_zero

    return deepspeed_zero


def has_frozen_parameters(model) -> bool:
    return any(not parameter.requires_grad for parameter in model.parameters())


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
