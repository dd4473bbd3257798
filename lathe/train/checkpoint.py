"""checkpoint-N folders: the transformers layout, written atomically (staging folder, fsync, one
rename), found again (skipping incomplete ones), rotated, and loaded safely."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from contextlib import contextmanager

import numpy as np
import torch

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
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"


def checkpoint_path(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")


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


def _write_manifest(folder: str) -> None:
    files = {}
    for root, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, folder)] = os.path.getsize(path)
    with open(os.path.join(folder, MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump({"format": 1, "complete": True, "files": files}, f, indent=2, sort_keys=True)


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
        raise _os_error(error, f"Cannot create a checkpoint folder in {parent!r}: {error}. Check that output_dir is writable.") from error
    return staging


def commit_staging(staging: str, final_path: str) -> None:
    """Write the manifest, flush everything to disk, then publish with one rename."""
    parent = os.path.dirname(os.path.abspath(final_path))
    _write_manifest(staging)
    _fsync_tree(staging)
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


def publish_staging(staging: str, final_path: str, write=None) -> None:
    """write(staging) if given, then commit_staging; if either fails, the staging folder goes and
    the error says what to check."""
    try:
        if write is not None:
            write(staging)
        commit_staging(staging, final_path)
    except BaseException as error:
        abort_staging(staging)
        raise explain_save_error(error, final_path) from error


def abort_staging(staging: str) -> None:
    shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def atomic_checkpoint(final_path: str, is_main_process: bool = True, barrier=None, committer=None, after_commit=None, write=None):
    """Yield a staging folder beside `final_path`; on success publish it with one rename.

    A crash at any moment leaves either the previous state or the complete new folder; a leftover
    staging folder is ignored by get_last_checkpoint and removed by the next save. With several
    processes, every rank writes its own files (e.g. rng_state_<rank>.pth) into the staging folder
    and only the main process creates and renames it, with `barrier` between the phases so the
    rename never publishes a folder another rank is still writing. `after_commit` (rotation) runs
    on the main process once the rename is done. `write(staging)`, if given, writes more files
    after the block. With a `committer` (a lathe.train.commit.BackgroundCommitter; single process
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
        if is_main_process:
            abort_staging(staging)
        raise explain_save_error(error, final_path) from error
    if is_main_process and after_commit is not None:
        after_commit()  # only after the rename is committed may rotation delete anything
    wait()  # nobody reads the new checkpoint (or rotates) before it is published


def explain_save_error(error: BaseException, final_path: str) -> BaseException:
    """The error to raise for a failed save: it names the checkpoint, says earlier ones are intact,
    and points at disk space and permissions (an OSError keeps its errno)."""
    if not isinstance(error, Exception):
        return error  # KeyboardInterrupt, SystemExit: nothing to explain
    hint = (
        f"Saving checkpoint {final_path!r} failed; earlier checkpoints are intact. "
        f"Check free disk space ({_free_space(final_path)}) and that the output folder is writable."
    )
    if isinstance(error, OSError):
        return _os_error(error, f"{hint} Cause: {error}")
    # torch.save reports a write that failed (full disk) as RuntimeError("[enforce fail at
    # inline_container.cc...] unexpected pos ..."), which names neither the disk nor the path.
    if hasattr(error, "add_note"):  # Python 3.11+
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
    """lathe checkpoints carry a manifest of file sizes; checkpoints written by transformers do not,
    so for those the trainer state and some model weights must exist and be non-empty."""
    manifest = os.path.join(folder, MANIFEST_NAME)
    if os.path.isfile(manifest):
        try:
            with open(manifest, encoding="utf-8") as f:
                files = json.load(f)["files"]
            return all(os.path.getsize(os.path.join(folder, name)) == size for name, size in files.items())
        except (OSError, ValueError, KeyError):
            return False
    state = os.path.join(folder, TRAINER_STATE_NAME)
    if not os.path.isfile(state) or os.path.getsize(state) == 0:
        return False
    try:
        with open(state, encoding="utf-8") as f:
            json.load(f)
    except ValueError:
        return False
    weights = [name for name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, ADAPTER_WEIGHTS_NAME, "pytorch_model.bin")
               if os.path.isfile(os.path.join(folder, name)) and os.path.getsize(os.path.join(folder, name)) > 0]
    # A transformers process killed while writing leaves truncated safetensors files, which
    # resume would then fail on ("SafetensorError: header too small"): check their lengths.
    return bool(weights) and all(_safetensors_files_complete(folder, name) for name in weights)


def _safetensors_files_complete(folder: str, name: str) -> bool:
    if name == WEIGHTS_INDEX_NAME:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                shards = set(json.load(f)["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return all(_safetensors_file_complete(os.path.join(folder, shard)) for shard in shards)
    return not name.endswith(".safetensors") or _safetensors_file_complete(os.path.join(folder, name))


def _safetensors_file_complete(path: str) -> bool:
    """Reads only the header: 8 bytes of header length, a JSON header whose data offsets say how
    long the file must be."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header_length = int.from_bytes(f.read(8), "little")
            if size < 8 + header_length:
                return False
            header = json.loads(f.read(header_length))
        data_end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
        return size >= 8 + header_length + data_end
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


def sorted_checkpoints(output_dir: str) -> list[str]:
    """checkpoint-N folders of output_dir, oldest step first (complete or not)."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = CHECKPOINT_PATTERN.match(name)
        path = os.path.join(output_dir, name)
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return [path for _step, path in sorted(found)]


def get_last_checkpoint(folder: str) -> str | None:
    """The newest *complete* checkpoint-N in `folder`; incomplete or corrupt ones are skipped with
    a warning (transformers would return them and crash on resume)."""
    for path in reversed(sorted_checkpoints(folder)):
        if is_complete_checkpoint(path):
            return path
        logger.warning("Skipping incomplete or corrupt checkpoint %s (interrupted while saving?).", path)
    return None


def rotate_checkpoints(output_dir: str, save_total_limit: int | None, best_model_checkpoint: str | None) -> list[str]:
    """Delete the oldest checkpoints beyond save_total_limit, never the best one (transformers'
    rule: the best is kept, and with a limit of 1 and a distinct best, 2 remain so the newest can
    still resume). Returns the deleted paths. Call only after the newest save is committed."""
    if not save_total_limit or save_total_limit <= 0:
        return []
    checkpoints = sorted_checkpoints(output_dir)
    best = os.path.abspath(best_model_checkpoint) if best_model_checkpoint else None
    absolute = [os.path.abspath(p) for p in checkpoints]
    limit = save_total_limit
    if best in absolute:
        # Keep the best by moving it just before the newest, so it falls inside the kept tail.
        index = absolute.index(best)
        if index < len(checkpoints) - 1:
            checkpoints.insert(len(checkpoints) - 2, checkpoints.pop(index))
        if save_total_limit == 1 and absolute[-1] != best:
            limit = 2  # keep the newest too, so the run can still resume
    to_delete = checkpoints[: max(0, len(checkpoints) - limit)]
    for path in to_delete:
        logger.info("Deleting older checkpoint %s (save_total_limit=%s).", path, save_total_limit)
        delete_checkpoint(path)
    return to_delete


def delete_checkpoint(path: str) -> None:
    """Rename out of the checkpoint-N namespace first, then delete: a process killed during the
    (non-atomic) rmtree leaves a staging leftover, never a half-deleted checkpoint-N folder."""
    trash = os.path.join(os.path.dirname(os.path.abspath(path)), STAGING_PREFIX + "deleting-" + os.path.basename(path))
    try:
        if os.path.exists(trash):
            shutil.rmtree(trash)
        os.rename(path, trash)
    except OSError:
        trash = path  # cannot rename (e.g. the filesystem refuses): delete in place as before
    shutil.rmtree(trash, ignore_errors=True)


def remove_staging_leftovers(output_dir: str) -> None:
    if os.path.isdir(output_dir):
        for name in os.listdir(output_dir):
            if name.startswith(STAGING_PREFIX):
                shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


# ----- RNG state -----

def rng_file_name(process_index: int, world_size: int) -> str:
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{process_index}.pth"


def safe_torch_load(path: str, map_location=None, allowed_classes=()):
    """torch.load with weights_only=True; numpy's RNG state (an ndarray inside a tuple) needs its
    reconstruction functions allow-listed, and `allowed_classes` (an optimizer's state objects, such as
    GaLore's projectors) are; nothing else is."""
    allowed = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), *allowed_classes]
    try:
        allowed.append(np._core.multiarray._reconstruct)
    except AttributeError:  # numpy < 2
        allowed.append(np.core.multiarray._reconstruct)
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location=map_location, weights_only=True)
