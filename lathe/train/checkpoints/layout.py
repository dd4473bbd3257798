"""checkpoint-N folders: the transformers layout, written atomically (staging folder, fsync, one
rename), checked for completeness and found again (skipping incomplete ones). Rotation is
lathe.train.checkpoints.rotation; reading the files safely, lathe.train.checkpoints.loading."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from contextlib import contextmanager

from lathe.train.checkpoints import shards
from lathe.train.checkpoints.shards import WEIGHTS_INDEX_NAME, WEIGHTS_NAME  # noqa: F401  (the layout's names, used here too)

logger = logging.getLogger(__name__)

PREFIX_CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_PATTERN = re.compile(r"^" + PREFIX_CHECKPOINT_DIR + r"-(\d+)$")
STAGING_PREFIX = ".staging-"
MANIFEST_NAME = "lathe_checkpoint.json"  # written last, inside the staging folder: "this is complete"
TRAINER_STATE_NAME = "trainer_state.json"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
TRAINING_ARGS_NAME = "training_args.bin"
TRAINING_ARGS_JSON = "training_args.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"


class CheckpointFileError(ValueError):
    """A checkpoint file lathe cannot use; the message names the file and says what is wrong."""


def checkpoint_path(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")


def step_in_name(path: str) -> int | None:
    """N of a path named checkpoint-N, else None."""
    match = CHECKPOINT_PATTERN.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def _fsync_tree(folder: str) -> None:
    """Flush every file and folder of the tree, so the rename below never publishes data that a
    power cut could still lose. The files are flushed concurrently: os.fsync releases the GIL and
    the filesystem folds concurrent flushes into fewer journal commits (10 files of a small LM's
    checkpoint: ~55 ms one after another, ~14 ms together, on this machine's ext4)."""
    files, folders = [], []
    for root, _dirs, names in os.walk(folder):
        files.extend(os.path.join(root, name) for name in names)
        folders.append(root)
    if files:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(len(files), 16), thread_name_prefix="lathe-fsync") as pool:
            list(pool.map(_fsync_file, files))  # list(): re-raise the first error here
    # Folders after their files: a folder entry must not become durable before what it names.
    for path in reversed(folders):
        _fsync_dir(path)


def _fsync_file(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not support fsync on directories
    finally:
        os.close(fd)


def _write_manifest(folder: str, step: int | None = None) -> None:
    """Every file's size, and the step the checkpoint holds: rotation deletes only folders whose
    manifest proves lathe wrote them as the checkpoint-N they are named (lathe.train.checkpoints.rotation)."""
    files = {}
    for root, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, folder)] = os.path.getsize(path)
    manifest = {"format": 1, "complete": True, "files": files}
    if step is not None:
        manifest["step"] = step
    with open(os.path.join(folder, MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)


def staging_path(final_path: str) -> str:
    parent = os.path.dirname(os.path.abspath(final_path))
    return os.path.join(parent, STAGING_PREFIX + os.path.basename(final_path))


def begin_staging(final_path: str) -> str:
    """Create an empty staging folder beside `final_path`, removing every staging leftover of
    earlier crashes first (not only this step's: a run resumed from an explicit path, or with
    other save_steps, might never save that step again, and nothing else would delete them)."""
    parent = os.path.dirname(os.path.abspath(final_path))
    try:
        os.makedirs(parent, exist_ok=True)
        staging = staging_path(final_path)
        remove_staging_leftovers(parent)
        if os.path.exists(staging):
            shutil.rmtree(staging)  # the clean-up above ignores errors; this folder must go, so raise
        os.makedirs(staging)
    except OSError as error:
        raise _os_error(
            error, f"Cannot create a checkpoint folder in {parent!r}: {error}. Check that output_dir is writable."
        ) from error
    return staging


def commit_staging(staging: str, final_path: str) -> None:
    """Write the manifest, flush everything to disk, then publish with one rename."""
    parent = os.path.dirname(os.path.abspath(final_path))
    _write_manifest(staging, step_in_name(final_path))
    _fsync_tree(staging)
    if os.path.lexists(final_path) and (
        os.path.islink(final_path) or not os.path.isfile(os.path.join(final_path, MANIFEST_NAME))
    ):
        _move_aside(final_path)  # not lathe's to delete: a link, or a folder of transformers' or a person's
    if os.path.exists(final_path):
        # Saving the same step twice (e.g. a step save and an epoch save): move the old one aside
        # first; a crash in between leaves it there as a staging leftover, ignored and cleaned.
        retired = os.path.join(parent, STAGING_PREFIX + "old-" + os.path.basename(final_path))
        if os.path.exists(retired):
            shutil.rmtree(retired)
        os.rename(final_path, retired)
        os.rename(staging, final_path)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.rename(staging, final_path)
    _fsync_dir(parent)


def _move_aside(path: str) -> None:
    """Rename `path` to `<path>.replaced-K` (a name no lookup matches) rather than delete it."""
    number = 1
    while os.path.lexists(f"{path}.replaced-{number}"):
        number += 1
    os.rename(path, f"{path}.replaced-{number}")
    logger.warning(
        "%s was in the way of the checkpoint being saved and was not written by lathe, so it was moved to %s, "
        "not deleted.",
        path,
        f"{path}.replaced-{number}",
    )


def publish_staging(staging: str, final_path: str, write=None) -> None:
    """write(staging) if given, then commit_staging; if either fails, the staging folder goes and
    the error says what to check."""
    try:
        if write is not None:
            write(staging)
        commit_staging(staging, final_path)
    except BaseException as error:
        explained = explain_save_error(error, final_path, staging=staging)
        abort_staging(staging)
        raise explained from error


def abort_staging(staging: str) -> None:
    shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def atomic_checkpoint(
    final_path: str, is_main_process: bool = True, barrier=None, committer=None, after_commit=None, write=None
):
    """Yield a staging folder beside `final_path`; on success publish it with one rename.

    A crash at any moment leaves either the previous state or the complete new folder; a leftover
    staging folder is ignored by get_last_checkpoint and removed by the next save. With several
    processes, every rank writes its own files (e.g. rng_state_<rank>.pth) into the staging folder
    and only the main process creates and renames it, with `barrier` between the phases so the
    rename never publishes a folder another rank is still writing. `after_commit` (rotation) runs
    on the main process once the rename is done. `write(staging)`, if given, writes more files
    after the block. With a `committer` (a lathe.train.checkpoints.commit.BackgroundCommitter; single process
    only) that write, the flush, the rename and after_commit run in its thread after the block, and
    their errors surface at its next wait().
    """
    wait = barrier or (lambda: None)
    staging = begin_staging(final_path) if is_main_process else staging_path(final_path)
    wait()  # the folder exists before any rank writes into it
    try:
        yield staging
        if is_main_process and committer is not None:
            committer.start(staging, final_path, after_commit, write=write)
            return
        if write is not None:
            write(staging)
        wait()  # every rank has written its files
        if is_main_process:
            commit_staging(staging, final_path)
    except BaseException as error:
        explained = explain_save_error(error, final_path, staging=staging)
        if is_main_process:
            abort_staging(staging)
        raise explained from error
    if is_main_process and after_commit is not None:
        after_commit()  # only after the rename is committed may rotation delete anything
    wait()  # nobody reads the new checkpoint (or rotates) before it is published


def explain_save_error(
    error: BaseException, final_path: str, summary: str | None = None, staging: str | None = None
) -> BaseException:
    """The error to raise for a failed save: it names the checkpoint (or says `summary`), says
    earlier ones are intact, and points at disk space and permissions (an OSError keeps its errno).
    A full disk names the file being written (diskfull.py). Raised `from error`, so lathe's message is
    what the traceback ends with."""
    if not isinstance(error, Exception):
        return error  # KeyboardInterrupt, SystemExit: nothing to explain
    from lathe.train.checkpoints.diskfull import disk_errno, failed_file

    summary = summary or f"Saving checkpoint {final_path!r} failed; earlier checkpoints are intact."
    hint = f"{summary} Check free disk space ({_free_space(final_path)}) and that the output folder is writable."
    number = disk_errno(error)
    file = failed_file(error, final_path, staging) if number is not None else None
    if isinstance(error, OSError) or (number is not None and "os error" in str(error)):  # safetensors' own words
        cause = f"writing {file}: {error}" if file else str(error)
        return OSError(number or error.errno, f"{hint} Cause: {cause}") if (number or error.errno) else OSError(hint)
    # torch.save reports a write that failed (full disk) as RuntimeError("[enforce fail at
    # inline_container.cc...] unexpected pos ..."), which names neither the disk nor the path.
    error.disk_errno = number  # the CLI prints a full disk as one line (lathe/llm/commands.py)
    if hasattr(error, "add_note"):  # Python 3.11+
        if file:
            error.add_note(f"(while writing {file})")
        error.add_note(hint)
    else:
        logger.error(hint)
    return error


def _os_error(error: OSError, message: str) -> OSError:
    """`message` with the errno of `error` kept (ENOSPC, EACCES, ...: OSError(errno, ...) also
    picks the matching subclass), so code that handles a full disk can still tell."""
    return OSError(error.errno, message) if error.errno is not None else OSError(message)


def _free_space(path: str) -> str:
    try:
        return f"{shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free / 2**20:.0f} MiB free"
    except OSError:
        return "free space unknown"


def is_complete_checkpoint(folder: str) -> bool:
    return checkpoint_problem(folder) is None


def checkpoint_problem(folder: str) -> str | None:
    """What makes `folder` unusable as a checkpoint, or None when it is complete. lathe checkpoints
    carry a manifest of file sizes; checkpoints written by transformers do not, so for those the
    trainer state must be JSON and some model weights must exist, at their full length."""
    manifest = os.path.join(folder, MANIFEST_NAME)
    if os.path.isfile(manifest):
        return _manifest_problem(folder, manifest)
    state = os.path.join(folder, TRAINER_STATE_NAME)
    if not os.path.isfile(state) or os.path.getsize(state) == 0:
        return f"{TRAINER_STATE_NAME} is {'empty' if os.path.isfile(state) else 'missing'}"
    try:
        with open(state, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError) as error:
        return f"{TRAINER_STATE_NAME} is not valid JSON ({error})"
    weights = [
        name
        for name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, ADAPTER_WEIGHTS_NAME, "pytorch_model.bin")
        if os.path.isfile(os.path.join(folder, name)) and os.path.getsize(os.path.join(folder, name)) > 0
    ]
    if not weights:
        return f"it has no model weights ({WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME} or {ADAPTER_WEIGHTS_NAME})"
    # A transformers process killed while writing leaves truncated safetensors files, which
    # resume would then fail on ("SafetensorError: header too small"): check their lengths.
    truncated = [name for name in weights if not shards.files_complete(folder, name)]
    return f"{truncated[0]} is truncated or corrupt" if truncated else None


def _manifest_problem(folder: str, manifest: str) -> str | None:
    try:
        with open(manifest, encoding="utf-8") as f:
            files = json.load(f)["files"]
        sizes = [(str(name), int(size)) for name, size in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"its {MANIFEST_NAME} is unreadable ({error!r})"
    relaid = shards.complete_layout(folder)
    for name, size in sizes:
        path = os.path.join(folder, name)
        if relaid and shards.is_model_weights_file(name) and not os.path.isfile(path):
            continue  # weights re-laid out since (sharded or merged): their own complete headers vouch for them
        if not os.path.isfile(path):
            return f"{name} is missing"
        if os.path.getsize(path) != size:
            return f"{name} has {os.path.getsize(path)} bytes, {MANIFEST_NAME} says {size}"
    return None


def checkpoint_step(folder: str) -> int | None:
    """The step a checkpoint holds: its manifest's "step", else its trainer_state.json's global_step
    (checkpoints of transformers and of older lathe versions); None when neither says."""
    for name, key in ((MANIFEST_NAME, "step"), (TRAINER_STATE_NAME, "global_step")):
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                step = json.load(f).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None


def numbered_entries(output_dir: str) -> list[tuple[int, str]]:
    """(N, path) of every entry of output_dir named checkpoint-N, whatever it is (folder, symbolic
    link, file), lowest N first."""
    if not os.path.isdir(output_dir):
        return []
    found = [(step_in_name(name), os.path.join(output_dir, name)) for name in os.listdir(output_dir)]
    return sorted((step, path) for step, path in found if step is not None)


def sorted_checkpoints(output_dir: str) -> list[str]:
    """checkpoint-N folders of output_dir, oldest step first (complete or not); symbolic links are
    not folders of output_dir and are left out."""
    return [path for _step, path in numbered_entries(output_dir) if os.path.isdir(path) and not os.path.islink(path)]


def get_last_checkpoint(folder: str) -> str | None:
    """The newest *complete* checkpoint-N in `folder`. Skipped with a warning (transformers would
    return them): incomplete or corrupt folders, a folder holding another step than its name says
    (a copy or a renamed folder), and symbolic links, which may lead to another run's checkpoint
    (pass such a path as resume_from_checkpoint to resume from it on purpose)."""
    for step, path in reversed(numbered_entries(folder)):
        if os.path.islink(path):
            logger.warning(
                "Not resuming from %s: it is a symbolic link (to %s), not a checkpoint this output_dir holds. "
                "Pass it as resume_from_checkpoint to resume from it.",
                path,
                os.path.realpath(path),
            )
            continue
        if not os.path.isdir(path):
            continue
        problem = checkpoint_problem(path)
        if problem is not None:
            logger.warning(
                "Skipping incomplete or corrupt checkpoint %s (interrupted while saving?): %s.", path, problem
            )
            continue
        held = checkpoint_step(path)
        if held is not None and held != step:
            logger.warning("Skipping %s: it holds the state of step %d (a copied or renamed checkpoint?).", path, held)
            continue
        return path
    return None


def remove_staging_leftovers(output_dir: str) -> None:
    """Delete what interrupted saves and deletions left under the `.staging-` prefix, lathe's own
    namespace; symbolic links are not followed."""
    if os.path.isdir(output_dir):
        for name in os.listdir(output_dir):
            path = os.path.join(output_dir, name)
            if name.startswith(STAGING_PREFIX) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)


def rng_file_name(process_index: int, world_size: int) -> str:
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{process_index}.pth"
