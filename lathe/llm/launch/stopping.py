"""Ctrl-C and SIGTERM in `lathe train`: finish the update step, save a checkpoint, print how to resume, exit.

lathe.train's Trainer, like transformers', leaves SIGINT alone (a library must not change what its users
observe); the `lathe train` command opts in here. The first signal during training asks lathe.train's
GracefulStopCallback to stop after the step in progress and save `checkpoint-<step>` (the ordinary
checkpoint, which resumes exactly); the run then ends with one line naming it and the command that
resumes it, and the exit code 128 + the signal (130 for SIGINT, 143 for SIGTERM). A signal before
training starts, after it ended, or a second one while stopping aborts at once, with one line too.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading

from lathe.train.callbacks.flow import GracefulStopCallback

__all__ = ["Interrupted", "TrainingStopped", "StopOnSignal"]


class Interrupted(BaseException):  # as KeyboardInterrupt: no `except Exception` swallows it
    """A signal that aborts at once: no checkpoint is written for the step in progress."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class TrainingStopped(BaseException):
    """Raised at train_end after a graceful stop, so the recipe does not save the model or evaluate."""

    def __init__(self, signum: int, step: int, max_steps: int, checkpoint: str | None):
        super().__init__(f"stopped at step {step}")
        self.signum, self.step, self.max_steps, self.checkpoint = signum, step, max_steps, checkpoint


class StopOnSignal(GracefulStopCallback):
    """The `lathe train` handler of SIGINT and SIGTERM, installed for the whole command (loading included)
    with `with StopOnSignal(...) as stop:`, and added to the Trainer's callbacks (stop.callbacks())."""

    def __init__(self, config_path, overrides: list[str], enabled: bool = True):
        super().__init__(signals=(signal.SIGINT, signal.SIGTERM))
        self.config_path, self.overrides = str(config_path), list(overrides)
        self.signum: int | None = None
        self.training = False
        self.installed = False
        self.enabled = enabled
        self.saved_handlers: dict = {}
        self.pid = os.getpid()
        self.output_dir: str | None = None

    def __enter__(self):
        # Python allows handlers only in the main thread; elsewhere (a notebook's worker) nothing changes.
        self.pid = os.getpid()
        if self.enabled and threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self.saved_handlers[signum] = signal.signal(signum, self.handle)
            self.installed = True
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self.saved_handlers.items():
            signal.signal(signum, previous)
        self.saved_handlers.clear()
        self.installed = False

    def callbacks(self) -> list:
        """[self] when the handlers are in place; the Trainer's callbacks then include the graceful stop."""
        return [self] if self.installed else []

    def handle(self, signum, frame) -> None:
        if os.getpid() != self.pid:  # a forked DataLoader worker (Ctrl-C reaches the whole process group)
            return  # it keeps serving batches until the main process, which decides, shuts it down
        name = signal.Signals(signum).name
        if not self.training or self.stop_requested:
            raise Interrupted(signum)
        self.stop_requested, self.signum = True, signum
        again = "Ctrl-C" if signum == signal.SIGINT else name
        print(
            f"\nlathe train: {name} received: finishing this step, then saving a checkpoint ({again} again to abort now).",
            file=sys.stderr,
            flush=True,
        )

    # The Trainer's events: the handlers are already in place (__enter__), so train_begin only marks the
    # window in which a signal means "stop gracefully"; GracefulStopCallback.on_step_end asks for the save.
    def on_train_begin(self, args, state, control, **kwargs):
        self.stop_requested, self.training, self.output_dir = False, True, args.output_dir

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False
        if self.stop_requested:
            checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            found = checkpoint if os.path.isdir(checkpoint) else None
            raise TrainingStopped(self.signum, state.global_step, state.max_steps, found)

    def resume_command(self, checkpoint: str) -> str:
        """The command line that resumes from `checkpoint`: this run's, with resume_from_checkpoint added."""
        overrides = [item for item in self.overrides if not item.lstrip("-").startswith("resume_from_checkpoint")]
        return shlex.join(["lathe", "train", self.config_path, *overrides, f"resume_from_checkpoint={checkpoint}"])

    def report(self, error: BaseException) -> int:
        """The one line that ends a stopped run, on stderr; the exit code (128 + the signal)."""
        if isinstance(error, TrainingStopped):
            name = signal.Signals(error.signum).name
            where = f"after step {error.step} of {error.max_steps}"
            if error.checkpoint is None:
                line = f"lathe train: stopped by {name} {where}; no checkpoint was written (saving is off)."
            else:
                line = (
                    f"lathe train: stopped by {name} {where}; checkpoint saved in {error.checkpoint}. "
                    f"Resume with: {self.resume_command(error.checkpoint)}"
                )
            print(line, file=sys.stderr, flush=True)
            return 128 + error.signum
        name = signal.Signals(error.signum).name
        last = None
        if self.output_dir is not None:
            from lathe.train.checkpoints.layout import get_last_checkpoint

            last = get_last_checkpoint(self.output_dir) if os.path.isdir(self.output_dir) else None
        kept = f"; the last complete checkpoint is {last}" if last else ""
        print(f"lathe train: aborted by {name}{kept}.", file=sys.stderr, flush=True)
        return 128 + error.signum
