"""`lathe train`'s progress bar on a terminal: the latest loss (and tokens/s) in the bar's postfix.

transformers' ProgressCallback writes every training log as a dict line above the bar; with logging_steps
of 1-10 the lines push the bar up the screen faster than it can be read. On a terminal, `lathe train`
shows the latest loss, learning rate and input tokens per second in the postfix instead; evaluation
metrics and the final summary are still written as lines. Anywhere else (a log file, a pipe, a test
capturing stderr) nothing changes: the dict lines stay where transformers users look for them.
"""

from __future__ import annotations

import sys
import time

from lathe.train.callbacks.flow import ProgressCallback

__all__ = ["PostfixProgressCallback", "use_postfix_bar"]


class PostfixProgressCallback(ProgressCallback):
    """ProgressCallback whose training-step logs (those with `loss`) set the bar's postfix."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.start, self.tokens_at_start = time.time(), state.num_input_tokens_seen or 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        bar = self.training_bar
        if not (state.is_world_process_zero and bar is not None and logs and "loss" in logs):
            return super().on_log(args, state, control, logs=logs, **kwargs)
        postfix = {"loss": f"{logs['loss']:.4g}"}
        if "learning_rate" in logs:
            postfix["lr"] = f"{logs['learning_rate']:.3g}"
        tokens = (state.num_input_tokens_seen or 0) - self.tokens_at_start
        elapsed = time.time() - self.start
        if tokens > 0 and elapsed > 0:
            postfix["tok/s"] = f"{tokens / elapsed:,.0f}"
        bar.set_postfix(postfix, refresh=True)


def use_postfix_bar(trainer, stream=None) -> bool:
    """Put PostfixProgressCallback in the place of the trainer's ProgressCallback when `stream` (stderr, where
    tqdm draws) is a terminal; True when it did."""
    stream = sys.stderr if stream is None else stream
    if not getattr(stream, "isatty", lambda: False)():
        return False
    callbacks = trainer.callback_handler.callbacks
    for index, callback in enumerate(callbacks):
        if type(callback) is ProgressCallback:
            callbacks[index] = PostfixProgressCallback(callback.max_str_len)
            return True
    return False
