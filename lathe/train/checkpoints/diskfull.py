"""A checkpoint write that ran out of room (ENOSPC, EFBIG: a file size limit, EDQUOT): which file, and that
earlier checkpoints are intact, as one OSError that keeps the errno (the CLI prints it as one line).

The writers report a full disk in their own words: Python's OSError, safetensors' "I/O error: ... (os error
27)", torch.save's "[enforce fail at inline_container.cc] unexpected pos" (no errno: when the disk still has
room, a file size limit is the cause). The file being written is the newest one in the staging folder."""

from __future__ import annotations

import errno
import os
import re
import shutil

DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
LOW_SPACE = 64 << 20  # bytes: below this, a write that failed without an errno ran out of disk


def disk_errno(error: BaseException, folder: str) -> int | None:
    """The ENOSPC / EFBIG / EDQUOT behind `error`, or None when it is something else."""
    if isinstance(error, OSError):
        return error.errno if error.errno in DISK_FULL else None
    text = str(error)
    found = re.search(r"os error (\d+)", text)
    if found is not None:
        number = int(found.group(1))
        return number if number in DISK_FULL else None
    if "unexpected pos" in text or "PytorchStreamWriter failed writing" in text:
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            return errno.ENOSPC
        return errno.ENOSPC if free < LOW_SPACE else errno.EFBIG
    return None


def last_written(staging: str) -> str | None:
    """The newest file under `staging` (the one whose write failed), or None."""
    newest = None
    for folder, _, files in os.walk(staging):
        for name in files:
            path = os.path.join(folder, name)
            try:
                stamp = os.stat(path).st_mtime_ns
            except OSError:
                continue
            if newest is None or stamp >= newest[0]:
                newest = (stamp, path)
    return None if newest is None else newest[1]


def disk_full_error(error: BaseException, final_path: str, staging: str | None) -> OSError | None:
    """One OSError naming the file and saying earlier checkpoints are intact, or None when `error` is not a
    full disk. Call it before the staging folder is removed."""
    parent = os.path.dirname(os.path.abspath(final_path))
    number = disk_errno(error, parent)
    if number is None:
        return None
    file = getattr(error, "filename", None)
    if not file and staging is not None:
        written = last_written(staging)
        file = os.path.join(final_path, os.path.relpath(written, staging)) if written else None
    try:
        free = f"{shutil.disk_usage(parent).free / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    return OSError(
        number,
        f"writing {file or final_path} failed: {os.strerror(number)} ({free}); checkpoint {final_path} was not "
        "saved and earlier checkpoints are intact. Free some space (or raise the file size limit) and resume.",
    )
