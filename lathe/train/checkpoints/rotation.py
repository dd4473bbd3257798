"""save_total_limit: which checkpoint-N entries of output_dir lathe may count and delete, and deleting
them. The rule: only a real folder (never a symbolic link) whose lathe_checkpoint.json proves lathe
wrote it complete, as the step its name says, or an empty folder (nothing in it to lose; os.rmdir
refuses if anything appears inside). Everything else is neither counted nor touched."""

from __future__ import annotations

import logging
import os
import re
import shutil

from lathe.train.checkpoints import layout as ckpt

logger = logging.getLogger(__name__)

# Entries already reported as left alone, so that a save every few steps does not repeat the warning.
_reported: set[tuple[str, str]] = set()


def owned_checkpoints(output_dir: str) -> list[str]:
    """The checkpoint-N folders of output_dir that lathe can prove it wrote, complete, lowest N first."""
    owned = []
    for step, path in ckpt.numbered_entries(output_dir):
        reason = why_not_owned(path, step)
        if reason is None:
            owned.append(path)
        elif (path, reason) not in _reported and not _is_empty_folder(path):
            _reported.add((path, reason))
            logger.warning("save_total_limit leaves %s alone and does not count it: %s.", path, reason)
    return owned


def why_not_owned(path: str, step: int) -> str | None:
    """None when `path` is a complete checkpoint lathe wrote for `step`; else why rotation must not delete it."""
    if os.path.islink(path):
        return f"it is a symbolic link (to {os.path.realpath(path)}), not a folder lathe wrote"
    if not os.path.isdir(path):
        return "it is not a folder"
    if not os.path.isfile(os.path.join(path, ckpt.MANIFEST_NAME)):
        return (
            f"it has no {ckpt.MANIFEST_NAME}, so lathe did not write it (transformers or a person did); "
            "delete it yourself if it is not needed"
        )
    problem = ckpt.checkpoint_problem(path)
    if problem is not None:
        return f"it is incomplete ({problem})"
    held = ckpt.checkpoint_step(path)
    if held != step:
        return f"it holds the state of step {held}, not {step} (a copied or renamed checkpoint?)"
    return None


def rotate_checkpoints(
    output_dir: str,
    save_total_limit: int | None = None,
    best_model_checkpoint: str | None = None,
    use_mtime: bool = False,
    checkpoint_prefix: str = ckpt.PREFIX_CHECKPOINT_DIR,
    *,
    newest: str | None = None,
) -> list[str]:
    """Delete the oldest of lathe's own checkpoints beyond save_total_limit; returns the deleted paths.
    transformers.trainer_utils.rotate_checkpoints' arguments (oldest by step, or by modification time with
    `use_mtime`). Never deleted: `newest` (the checkpoint just published, whatever its number; by default
    the last one), the best one (transformers' rule: the best is kept, and with a limit of 1 and a distinct
    best, 2 remain so the newest can still resume), and anything owned_checkpoints does not list: unlike
    transformers, a checkpoint-N folder lathe did not write is never deleted (nor counted) unless it is
    empty. Call only after the newest save is committed."""
    if checkpoint_prefix != ckpt.PREFIX_CHECKPOINT_DIR:
        raise ValueError(
            f"lathe writes checkpoints as {ckpt.PREFIX_CHECKPOINT_DIR}-N; got checkpoint_prefix={checkpoint_prefix!r}"
        )
    if not save_total_limit or save_total_limit <= 0:
        return []
    order = owned_checkpoints(output_dir)
    if use_mtime:
        by_time = sort_checkpoints(output_dir, use_mtime=True)
        order = [path for path in by_time if path in order]
    # Empty checkpoint-N folders count as transformers counts them, but as the oldest: they go first,
    # so one never costs a checkpoint that holds something.
    owned = set(order)
    order = [path for _step, path in ckpt.numbered_entries(output_dir) if _is_empty_folder(path)] + order
    # The newest last and the best just before it, so both fall inside the kept tail.
    newest = _find(order, newest) or (order[-1] if order else None)
    best = _find(order, best_model_checkpoint)
    for kept in (best, newest):
        if kept is not None:
            order.remove(kept)
            order.append(kept)
    limit = 2 if save_total_limit == 1 and best is not None and best != newest else save_total_limit
    to_delete = order[: max(0, len(order) - limit)]
    deleted = []
    for path in to_delete:
        logger.info("Deleting older checkpoint %s (save_total_limit=%s).", path, save_total_limit)
        if path in owned:
            delete_checkpoint(path)
        elif not _remove_empty_folder(path):
            continue
        deleted.append(path)
    return deleted


def keep_only(output_dir: str, kept: str) -> list[str]:
    """Delete every checkpoint of lathe's own in output_dir but `kept` (the end of a run with
    save_total_limit=1 and a distinct best); returns the deleted paths."""
    to_delete = [path for path in owned_checkpoints(output_dir) if not os.path.samefile(path, kept)]
    for path in to_delete:
        delete_checkpoint(path)
    return to_delete


def _is_empty_folder(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)


def _remove_empty_folder(path: str) -> bool:
    """os.rmdir removes only an empty folder: if something was put inside since it was listed, it stays."""
    try:
        os.rmdir(path)
        return True
    except OSError as error:
        logger.warning("save_total_limit leaves %s alone: %s.", path, error.strerror or error)
        return False


def _find(paths: list[str], wanted: str | None) -> str | None:
    if wanted is None:
        return None
    wanted = os.path.abspath(wanted)
    return next((path for path in paths if os.path.abspath(path) == wanted), None)


def delete_checkpoint(path: str) -> None:
    """Rename out of the checkpoint-N namespace first, then delete: a process killed during the
    (non-atomic) rmtree leaves a staging leftover, never a half-deleted checkpoint-N folder. A
    symbolic link is never deleted, nor what it leads to."""
    if os.path.islink(path):
        logger.warning("Not deleting %s: it is a symbolic link.", path)
        return
    trash = os.path.join(
        os.path.dirname(os.path.abspath(path)), ckpt.STAGING_PREFIX + "deleting-" + os.path.basename(path)
    )
    try:
        if os.path.lexists(trash):
            shutil.rmtree(trash)
        os.rename(path, trash)
    except OSError:
        trash = path  # cannot rename (e.g. the filesystem refuses): delete in place as before
    shutil.rmtree(trash, ignore_errors=True)


def sort_checkpoints(
    output_dir: str,
    checkpoint_prefix: str = ckpt.PREFIX_CHECKPOINT_DIR,
    use_mtime: bool = False,
    best_model_checkpoint: str | None = None,
) -> list[str]:
    """transformers.trainer_utils.sort_checkpoints: the <checkpoint_prefix>-N folders of output_dir (any of
    them: listing deletes nothing), oldest first by N, or by modification time with `use_mtime` (by N when
    those times span less than a second, which some filesystems fake); the best one moved second to last."""
    pattern = re.compile(re.escape(checkpoint_prefix) + r"-(\d+)$")
    found = []
    for name in sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []:
        path, match = os.path.join(output_dir, name), pattern.match(name)
        if match and os.path.isdir(path):
            found.append((os.path.getmtime(path) if use_mtime else int(match.group(1)), path))
    found.sort()
    if use_mtime and len(found) > 1 and found[-1][0] - found[0][0] < 1.0:
        return sort_checkpoints(output_dir, checkpoint_prefix, False, best_model_checkpoint)
    paths = [path for _, path in found]
    best = _find(paths, best_model_checkpoint)
    if best is not None and best != paths[-1]:
        paths.remove(best)
        paths.insert(len(paths) - 1, best)
    return paths
