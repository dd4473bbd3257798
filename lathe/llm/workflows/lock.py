"""One writer per output_dir: `lathe train` (from the command line or the web page) holds output_dir/.lathe.lock,
a small JSON file with its pid and host, while it trains. A second run into the same folder stops with one
line naming the owner; a lock left by a process that died (same host, pid gone) is stale and replaced. Only
rank 0 of a multi-process run takes it (the ranks are one run)."""

from __future__ import annotations

import json
import os
import socket
import time

LOCK_NAME = ".lathe.lock"


class OutputDirBusy(ValueError):
    """Another live `lathe train` writes to this output_dir."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def read_owner(output_dir: str) -> dict | None:
    try:
        with open(os.path.join(output_dir, LOCK_NAME), encoding="utf-8") as f:
            owner = json.load(f)
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def busy_message(output_dir: str) -> str | None:
    """One line when a live run (or one on another host: we cannot tell) holds output_dir; None when free or
    the lock is stale."""
    path = os.path.join(output_dir, LOCK_NAME)
    if not os.path.exists(path):
        return None
    owner = read_owner(output_dir) or {}
    pid, host = owner.get("pid"), owner.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
        return None  # stale: its process is gone
    if pid == os.getpid() and host == socket.gethostname():
        return None
    since = owner.get("started")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else ""
    return (
        f"output_dir {output_dir} is in use by another lathe train (pid {pid} on {host}{when}): wait for it, stop "
        f"it, or choose another output_dir (delete {path} if that run is gone)."
    )


class OutputDirLock:
    """`with OutputDirLock(output_dir):` around a training run; OutputDirBusy when another live run holds it."""

    def __init__(self, output_dir: str, enabled: bool = True):
        self.path = os.path.join(output_dir, LOCK_NAME)
        self.output_dir, self.enabled, self.held = output_dir, enabled, False

    def __enter__(self):
        if not self.enabled:
            return self
        os.makedirs(self.output_dir, exist_ok=True)
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
        for _ in range(2):
            try:
                handle = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                message = busy_message(self.output_dir)
                if message is not None:
                    raise OutputDirBusy(message) from None
                try:  # stale (or our own): replace it
                    os.remove(self.path)
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(handle, "w", encoding="utf-8") as f:
                f.write(record)
            self.held = True
            return self
        raise OutputDirBusy(f"output_dir {self.output_dir}: could not take {self.path} (another run took it).")

    def __exit__(self, *exc):
        if self.held:
            owner = read_owner(self.output_dir) or {}
            if owner.get("pid") == os.getpid():
                try:
                    os.remove(self.path)
                except FileNotFoundError:
                    pass
            self.held = False
        return False
