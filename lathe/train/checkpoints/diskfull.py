"""A checkpoint write that ran out of room (ENOSPC; EFBIG: a file size limit; EDQUOT: a quota): its errno and
the file being written, for layout.explain_save_error's message.

The writers report a full disk in their own words: Python's OSError, safetensors' "I/O error: ... (os error
27)", torch.save's "[enforce fail at inline_container.cc] unexpected pos" (no errno: EFBIG when a file size
limit is set, else ENOSPC). The file being written is the error's own filename, else the newest file in the
staging folder."""

from __future__ import annotations

import errno
import os
import re

DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def disk_errno(error: BaseException) -> int | None:
    """The ENOSPC / EFBIG / EDQUOT behind `error`, or None when it is something else."""
    if isinstance(error, OSError):
        return error.errno if error.errno in DISK_FULL else None
    text = str(error)
    found = re.search(r"os error (\d+)", text)
    if found is not None:
        number = int(found.group(1))
        return number if number in DISK_FULL else None
    if "unexpected pos" in text or "PytorchStreamWriter failed writing" in text:
        import resource

        limited = resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY
        return errno.EFBIG if limited else errno.ENOSPC
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


def failed_file(error: BaseException, final_path: str, staging: str | None) -> str | None:
    """The file whose write failed, named where it would have been published (under final_path)."""
    file = getattr(error, "filename", None)
    if file and staging and os.path.abspath(str(file)).startswith(os.path.abspath(staging) + os.sep):
        return os.path.join(final_path, os.path.relpath(os.path.abspath(str(file)), os.path.abspath(staging)))
    if file:
        return str(file)
    written = last_written(staging) if staging and os.path.isdir(staging) else None
    return os.path.join(final_path, os.path.relpath(written, staging)) if written else None
