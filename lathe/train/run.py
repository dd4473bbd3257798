"""What one train() call keeps between update steps and never checkpoints: the loss tally between logs,
where the run started (step, tokens, clock), the last learning rate, and how far into its epoch it is.
Everything that must survive a resume lives in TrainerState instead."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from lathe.train.parallel import distributed


class LossTracker:
    """Sums micro-batch losses between logging points, as transformers does (float32, in order),
    without a finiteness check per micro-batch: that check forces a host sync on GPU and costs
    ~20 µs on CPU. logging_nan_inf_filter is applied when the window is read: a non-finite window
    sum is replayed from the kept losses with transformers' rule (a non-finite loss counts as the
    window's running mean), so logged numbers are the same, bit for bit."""

    def __init__(self, device, nan_inf_filter: bool):
        self.nan_inf_filter = nan_inf_filter
        self.window_sum = torch.zeros((), device=device)
        self.window: list[tuple[torch.Tensor, int]] = []  # (loss, updates done in this window so far)
        self.nonfinite = 0

    def add(self, loss: torch.Tensor, updates_in_window: int) -> None:
        self.window_sum += loss
        if self.nan_inf_filter:
            self.window.append((loss, updates_in_window))

    def take(self) -> float:
        """The window's loss sum (filtered), then start a new window."""
        total = self.window_sum.item()
        if self.nan_inf_filter and not math.isfinite(total):
            total = self._replay()
        self.window_sum.zero_()
        self.window.clear()
        return total

    def _replay(self) -> float:
        running = torch.zeros((), dtype=self.window_sum.dtype)
        for loss, updates in self.window:
            loss = loss.detach().cpu()
            if torch.isfinite(loss):
                running += loss
            else:
                running += running / (1 + updates)
                self.nonfinite += 1
        return running.item()


@dataclass
class TrainingRun:
    """The per-run tally of Trainer._training_loop (one per train() call, and per batch-size retry)."""

    losses: LossTracker  # micro-batch losses since the last log
    first_step: int  # global_step when this call started: train_loss averages over this call's steps only
    step_last_logged: int
    tokens_at_start: int  # num_input_tokens_seen when this call started (train_tokens_per_second counts the rest)
    start_time: float = field(default_factory=time.time)
    total_loss: float = 0.0  # sum of the logged windows' losses (each a sum over its updates)
    learning_rate: float | None = None  # the rate the last update used, read before the scheduler moved it
    batches_done_in_epoch: int = 0  # micro-batches of the current epoch, skipped ones included

    @classmethod
    def start(cls, state, args) -> TrainingRun:
        return cls(
            LossTracker(args.device, args.logging_nan_inf_filter),
            first_step=state.global_step,
            step_last_logged=state.global_step,
            tokens_at_start=state.num_input_tokens_seen,
        )

    def take_logged_loss(self, global_step: int, device) -> float:
        """The mean loss per update since the last log, over all ranks; the window joins the run's total."""
        window_loss = distributed.mean_across_ranks(self.losses.take(), device)
        loss = window_loss / (global_step - self.step_last_logged)
        self.total_loss += window_loss
        self.step_last_logged = global_step
        return loss

    def train_loss(self, global_step: int, device) -> float:
        """train_loss of TrainOutput: the mean loss per update of this call, unlogged last window included."""
        self.total_loss += distributed.mean_across_ranks(self.losses.take(), device)
        steps_run = max(global_step - self.first_step, 0)
        return self.total_loss / steps_run if steps_run else 0.0

    def steps_run(self, global_step: int) -> int:
        return max(global_step - self.first_step, 0)
