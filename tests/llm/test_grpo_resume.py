"""GRPO (and RLOO) resume exactly: a run stopped inside one generation's span of steps (num_iterations 2) or at an
epoch's end, and resumed from that checkpoint, logs the uninterrupted run's numbers (the buffered completions,
the step counter, the sampling RNG and the prompt order of a later epoch all come back)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import grpo_cases  # noqa: E402

from lathe.llm.rl import GRPOConfig, GRPOTrainer  # noqa: E402

SKIPPED = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss")


def trainer_for(model_dir: str, output_dir: str) -> GRPOTrainer:
    settings = {**grpo_cases.BASE, "max_steps": 5, "num_iterations": 2, "beta": 0.1, "save_strategy": "steps"}
    args = GRPOConfig(output_dir=output_dir, save_steps=1, **settings)
    # 4 prompts, 2 per generation, each generation used twice: 4 steps an epoch, the 5th in the next epoch.
    return GRPOTrainer(
        model=model_dir,
        reward_funcs=grpo_cases.REWARDS,
        args=args,
        train_dataset=grpo_cases.dataset().select(range(4)),
    )


def logged(trainer) -> dict[int, dict]:
    return {
        entry["step"]: {k: v for k, v in entry.items() if k not in SKIPPED}
        for entry in trainer.state.log_history
        if "loss" in entry
    }


def test_a_resumed_run_logs_the_uninterrupted_numbers(tmp_path):
    torch.set_num_threads(1)
    model_dir = tmp_path / "model"
    grpo_cases.build_model(model_dir)
    whole = trainer_for(str(model_dir), str(tmp_path / "whole"))
    whole.train()
    expected = logged(whole)
    assert sorted(expected) == [1, 2, 3, 4, 5]
    for stopped in (1, 4):  # inside a generation's two steps; at the end of the first epoch
        resumed = trainer_for(str(model_dir), str(tmp_path / f"resumed{stopped}"))
        resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{stopped}"))
        got = {step: values for step, values in logged(resumed).items() if step > stopped}  # earlier: the checkpoint's
        assert sorted(got) == list(range(stopped + 1, 6))
        for step, values in got.items():
            for key, value in expected[step].items():
                assert math.isclose(values[key], value, rel_tol=1e-6, abs_tol=1e-9), (
                    f"resumed at {stopped}, step {step} {key}: {values[key]} vs {value}"
                )


def test_rloo_resumed_inside_a_generation_logs_the_uninterrupted_numbers(tmp_path):
    """RLOOTrainer keeps GRPO's buffer: its old log-probs (always computed) and leave-one-out advantages too."""
    from lathe.llm.rl import RLOOConfig, RLOOTrainer

    torch.set_num_threads(1)
    model_dir = tmp_path / "model"
    grpo_cases.build_model(model_dir)

    def run(folder: str, resume: str | None = None) -> dict:
        settings = {**grpo_cases.BASE, "max_steps": 3, "num_iterations": 2, "save_strategy": "steps"}
        args = RLOOConfig(output_dir=folder, save_steps=1, **settings)
        trainer = RLOOTrainer(
            model=str(model_dir), reward_funcs=grpo_cases.REWARDS, args=args, train_dataset=grpo_cases.dataset()
        )
        trainer.train(resume_from_checkpoint=resume)
        return logged(trainer)

    expected = run(str(tmp_path / "whole"))
    got = run(str(tmp_path / "resumed"), str(tmp_path / "whole" / "checkpoint-1"))
    assert sorted(expected) == [1, 2, 3] and sorted(step for step in got if step > 1) == [2, 3]
    for step in (2, 3):
        for key, value in expected[step].items():
            assert math.isclose(got[step][key], value, rel_tol=1e-6, abs_tol=1e-9), f"step {step} {key}"
