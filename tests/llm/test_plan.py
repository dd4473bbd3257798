"""The plan `lathe train` prints, the resolved-config print, and LLaMA-Factory's output_dir resume rules."""

import os

import pytest
import torch

from lathe.llm.config.train import parse_train_config
from lathe.llm.workflows.plan import format_config, format_plan, make_plan
from lathe.llm.workflows.setup import resolve_resume_checkpoint

BASE = {"model_name_or_path": "m", "dataset": "d", "finetuning_type": "full", "report_to": "none"}


def _dataset(rows: int, length: int, trained: int):
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset.from_dict(
        {
            "input_ids": [[5] * length for _ in range(rows)],
            "labels": [[-100] * (length - trained) + [5] * trained for _ in range(rows)],
        }
    )


def test_plan_counts_examples_tokens_steps_and_parameters(tmp_path):
    config = parse_train_config(
        {
            **BASE,
            "output_dir": str(tmp_path),
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "num_train_epochs": 3,
            "logging_steps": 5,
            "eval_strategy": "steps",
            "eval_steps": 0.5,
            "val_size": 0.1,
            "save_strategy": "epoch",
            "save_total_limit": 2,
        }
    )
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[1].requires_grad_(False)
    plan = make_plan(config, {"train_dataset": _dataset(30, 10, 4), "eval_dataset": _dataset(3, 10, 4)}, model)
    assert (plan.train_examples, plan.train_tokens, plan.trained_tokens, plan.eval_examples) == (30, 300, 120, 3)
    # 30 examples / 4 per batch = 8 batches -> 4 updates of 2 accumulated batches, 3 epochs.
    assert (plan.batch_size, plan.steps_per_epoch, plan.total_steps) == (8, 4, 12)
    assert (plan.trainable_parameters, plan.total_parameters) == (20, 30)
    text = format_plan(plan, config)
    assert "train tokens    300 (120 trained, 40.0%)" in text
    assert "steps           4 per epoch, 12 in total (3.00 epochs)" in text
    assert "log: every 5 steps" in text
    assert "evaluate: every 6 steps" in text  # half of the run
    assert "save: at the end of each epoch, keeping the last 2" in text
    assert "20 trainable of 30" in text and "fp32 on cpu" in text
    assert "checkpointing   activations on (disable_gradient_checkpointing: true trades memory for speed)" in text
    config.training.gradient_checkpointing = False
    assert "checkpointing   activations off" in format_plan(plan, config)


def test_config_print_shows_what_differs_from_the_defaults():
    text = format_config(parse_train_config({**BASE, "lora_rank": 4, "cutoff_len": 512}))
    assert "lora_rank: 4" in text and "cutoff_len: 512" in text and "do_train: True" in text
    assert "lora_dropout" not in text and "temperature" not in text


def _finished_run(folder, with_checkpoint: int | None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(b"")
    if with_checkpoint is not None:
        checkpoint = folder / f"checkpoint-{with_checkpoint}"
        checkpoint.mkdir()
        (checkpoint / "trainer_state.json").write_text("{}")
        (checkpoint / "lathe_checkpoint.json").write_text('{"files": {"trainer_state.json": 2}}')  # "complete"


def test_resume_rules_follow_llamafactory(tmp_path):
    fresh = parse_train_config({**BASE, "output_dir": str(tmp_path / "new")})
    assert resolve_resume_checkpoint(fresh) is None

    _finished_run(tmp_path / "done", with_checkpoint=None)
    config = parse_train_config({**BASE, "output_dir": str(tmp_path / "done")})
    with pytest.raises(ValueError, match="already holds a trained model .*overwrite_output_dir"):
        resolve_resume_checkpoint(config)
    config = parse_train_config({**BASE, "output_dir": str(tmp_path / "done"), "overwrite_output_dir": True})
    assert resolve_resume_checkpoint(config) is None

    explicit = parse_train_config({**BASE, "output_dir": str(tmp_path / "done"), "resume_from_checkpoint": "elsewhere"})
    assert resolve_resume_checkpoint(explicit) == "elsewhere"


def test_interrupted_run_resumes_from_its_last_checkpoint(tmp_path):
    _finished_run(tmp_path / "run", with_checkpoint=5)
    config = parse_train_config({**BASE, "output_dir": str(tmp_path / "run")})
    assert resolve_resume_checkpoint(config) == os.path.join(str(tmp_path / "run"), "checkpoint-5")
    evaluating = parse_train_config({**BASE, "output_dir": str(tmp_path / "run"), "do_train": False})
    assert resolve_resume_checkpoint(evaluating) is None
