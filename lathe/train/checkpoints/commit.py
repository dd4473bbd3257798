"""Background checkpoint commits: writing a checkpoint from a copy of the state, its flush to disk,
rename and rotation, run in a thread while training goes on."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from lathe.train.checkpoints import layout as ckpt

logger = logging.getLogger(__name__)


class BackgroundCommitter:
    """At most one commit in flight. The loop takes a copy of the state (lathe.train.checkpoints.snapshot);
    serializing it, making the files durable (fsync of every file, ~15-50 ms here) and publishing
    them (rename, then rotation) overlap the next steps instead of stalling them. A crash before
    the rename leaves the previous checkpoint as the newest, exactly as a crash during a
    synchronous save would.

    wait() joins the commit in flight and re-raises its error. Call it before anything reads the
    checkpoint: the next save, on_save listeners, the end of train()."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(
        self,
        staging: str,
        final_path: str,
        after: Callable[[], None] | None = None,
        write: Callable[[str], None] | None = None,
    ) -> None:
        """Run write(staging) (files from a copy of the state), then commit `staging` as
        `final_path` in the background, then run `after` (e.g. rotation)."""
        self.wait()
        # Not a daemon: an exception that ends the program still lets the last checkpoint publish.
        self._thread = threading.Thread(
            target=self._commit, args=(staging, final_path, after, write), name="lathe-checkpoint-commit"
        )
        self._thread.start()

    def _commit(self, staging: str, final_path: str, after, write) -> None:
        try:
            ckpt.publish_staging(staging, final_path, write=write)
            if after is not None:
                after()
        except BaseException as error:  # handed to the training thread at its next wait()
            self._error = error

    def wait(self, raise_error: bool = True) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is None:
            return
        if raise_error:
            raise error
        logger.error("A checkpoint commit failed while training was already stopping: %s", error)
