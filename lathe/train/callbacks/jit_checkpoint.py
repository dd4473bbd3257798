"""enable_jit_checkpoint: transformers' just-in-time checkpoint on SIGTERM, with its public classes
(`CheckpointManager`, `JITCheckpointCallback`) and timing: the signal arms a timer of `kill_wait`
seconds (a SIGKILL that follows within the grace period leaves no half-done work), then the next step
hook saves a checkpoint through the Trainer and stops training.

What differs from transformers, by design: lathe's checkpoints are published by one rename, so no
`checkpoint-is-incomplete.txt` sentinel is written; an interrupted save leaves no checkpoint-N folder.
A checkpoint taken in `on_pre_optimizer_step` is taken mid-step, as in transformers: it holds the weights,
optimizer, schedule and data position before that step, but the random state after its forward passes and
`num_input_tokens_seen` / `total_flos` counting its micro-batches; resuming redoes the step (other dropout
draws, those micro-batches counted twice). For an exact resume, lathe's `GracefulStopCallback` stops and
saves at a step boundary."""

from __future__ import annotations

import logging
import signal
import threading

from lathe.train.callbacks.events import TrainerCallback

logger = logging.getLogger(__name__)


class CheckpointManager:
    """Holds the SIGTERM handler and the request flag; `execute_jit_checkpoint` has the Trainer save."""

    def __init__(self, trainer, kill_wait: int = 3):
        self.trainer = trainer
        self.is_checkpoint_requested = False
        self._original_sigterm_handler = None
        self.kill_wait = kill_wait

    def setup_signal_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise ValueError(
                "enable_jit_checkpoint=True installs a SIGTERM handler, which Python allows only in the main "
                "thread: create the Trainer in the main thread, or set enable_jit_checkpoint=False."
            )
        self._original_sigterm_handler = signal.signal(signal.SIGTERM, self._sigterm_handler)
        logger.info("JIT checkpoint signal handler registered for SIGTERM")

    def _sigterm_handler(self, signum, frame) -> None:
        if self.is_checkpoint_requested:
            return
        logger.info("SIGTERM received, will request JIT checkpoint after %ss", self.kill_wait)
        threading.Timer(self.kill_wait, self._enable_checkpoint).start()

    def _enable_checkpoint(self) -> None:
        logger.info("Kill wait period elapsed, requesting checkpoint")
        self.is_checkpoint_requested = True

    def execute_jit_checkpoint(self) -> None:
        """Save checkpoint-<global_step> now; the flag is cleared first, so a failing save is not retried
        by the next hook (the error propagates, as in transformers)."""
        self.is_checkpoint_requested = False
        logger.info("Saving JIT checkpoint at step %d", self.trainer.state.global_step)
        try:
            self.trainer._save_checkpoint(self.trainer.model, trial=None)
        except Exception as error:
            logger.error("Failed to save JIT checkpoint: %s", error)
            raise
        logger.info("Immediate JIT checkpoint completed successfully")


class JITCheckpointCallback(TrainerCallback):
    """Added by the Trainer when `enable_jit_checkpoint=True`: at the first step hook after the grace
    period, save and stop (`should_training_stop`; the step-end save is cancelled, the checkpoint exists)."""

    def __init__(self):
        self.trainer = None
        self.jit_manager: CheckpointManager | None = None

    def set_trainer(self, trainer) -> None:
        self.trainer = trainer
        if trainer.args.enable_jit_checkpoint:
            self.jit_manager = CheckpointManager(trainer=trainer)
            self.jit_manager.setup_signal_handler()
            logger.info("JIT checkpointing enabled")

    def _requested(self) -> bool:
        return self.jit_manager is not None and self.jit_manager.is_checkpoint_requested

    def _save_and_stop(self, control, cancel_save: bool) -> None:
        if cancel_save:
            control.should_save = False
        control.should_training_stop = True
        self.jit_manager.execute_jit_checkpoint()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._requested():
            self._save_and_stop(control, cancel_save=False)

    def on_step_begin(self, args, state, control, **kwargs):
        if self._requested():
            self._save_and_stop(control, cancel_save=False)

    def on_step_end(self, args, state, control, **kwargs):
        if self._requested():
            self._save_and_stop(control, cancel_save=True)

    def on_epoch_end(self, args, state, control, **kwargs):
        if self._requested():
            self._save_and_stop(control, cancel_save=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.jit_manager is not None and self.jit_manager._original_sigterm_handler is not None:
            signal.signal(signal.SIGTERM, self.jit_manager._original_sigterm_handler)
            logger.info("Restored original SIGTERM handler after training completion")
