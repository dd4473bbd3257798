"""`lathe train`'s start-up without the garbage collector's full scans.

Importing torch, transformers, datasets, peft and DeepSpeed creates about a million objects that live as long as the
process and form almost no reference cycles. Python's collector runs a full scan of every tracked object each time
the long-lived ones have grown by a quarter: 8 full scans of a growing heap in a short `lathe train` (counted with
gc.callbacks), ~1.3 CPU s; with them held back, 9.1 instead of 11.3 CPU s per 3-step run of the quickstart config
(6 interleaved runs each, one thread).

While the command starts, StartupCollector leaves the young generations' collections as they are (young cycles are
freed as before) and holds the full scans back; when training begins it puts Python's thresholds back and freezes
what start-up created (gc.freeze: those objects are never scanned again, and are still freed by reference counting
as before). When the collector runs does not enter the computation: the suite's goldens pass unchanged.
"""

from __future__ import annotations

import gc

from lathe.train.callbacks.events import TrainerCallback

__all__ = ["StartupCollector"]

# gc.set_threshold's third value: how many generation-1 collections before a full one. High enough that none runs
# while the command starts (a few hundred generation-1 collections), not disabled: a start that never reaches
# training still collects eventually.
FULL_SCANS_HELD = 1_000_000


class StartupCollector(TrainerCallback):
    """A context for the command's start and a callback whose on_train_begin ends it (or the context's exit,
    for a run that never trains: dry runs, predict-only runs, errors)."""

    def __init__(self):
        self.thresholds = None

    def __enter__(self) -> StartupCollector:
        self.thresholds = gc.get_threshold()
        gc.set_threshold(self.thresholds[0], self.thresholds[1], FULL_SCANS_HELD)
        return self

    def __exit__(self, *exc_info) -> None:
        self.started()

    def started(self) -> None:
        """Python's thresholds back, start-up's objects frozen out of the scans; once."""
        if self.thresholds is not None:
            gc.set_threshold(*self.thresholds)
            self.thresholds = None
            gc.freeze()

    def on_train_begin(self, args, state, control, **kwargs):
        self.started()
