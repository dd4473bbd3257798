"""Exact resume of GRPO: what a checkpoint needs besides the Trainer's files. One generation serves
steps_per_generation x num_iterations micro-steps, so a run stopped inside that span must get back the
buffered completions (with their advantages and old log-probs), the micro-step counter and the metrics not
logged yet; the sampling RNG is the Trainer's (rng_state.pth) and the prompt order the sampler's (by epoch)."""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)


def state_file(folder: str, process_index: int) -> str:
    return os.path.join(folder, f"grpo_state_{process_index}.pt")


def save_generation_state(trainer) -> None:
    """Into the checkpoint just published (each process its own file)."""
    from lathe.train.checkpoints.layout import checkpoint_path

    trainer._checkpoint_commits.wait()  # the folder exists once the checkpoint is published
    folder = checkpoint_path(trainer.args.output_dir, trainer.state.global_step)
    state = {
        "step": trainer._step,
        "buffer": trainer._buffered_inputs,
        "metrics": {mode: dict(values) for mode, values in trainer._metrics.items()},
    }
    torch.save(state, state_file(folder, trainer.args.process_index))


def load_generation_state(trainer, folder: str) -> None:
    path = state_file(folder, trainer.args.process_index)
    if not os.path.isfile(path):
        logger.warning(
            "%s has no GRPO generation state (written by another tool?): the step counter restarts and the next "
            "step samples a new generation batch, so the run is not the uninterrupted one.",
            folder,
        )
        return
    state = torch.load(path, map_location=trainer.args.device, weights_only=False)
    trainer._step, trainer._buffered_inputs = state["step"], state["buffer"]
    for mode, values in state["metrics"].items():
        trainer._metrics[mode].update(values)
