"""Small `lathe train` runs that several test files start the same way: the LoRA sft config of the first- and
second-day tests, and a three-step LoRA run on an addition set whose adapter the export tests export."""

from __future__ import annotations

import json


def lora_sft_config(model_dir, data_dir, output_dir, **extra) -> dict:
    """A 2-step LoRA sft of the `add` dataset in `data_dir` (chatml, cutoff 64, batch 4, seed 7); `extra` overrides."""
    values = {
        "model_name_or_path": model_dir,
        "stage": "sft",
        "finetuning_type": "lora",
        "dataset_dir": data_dir,
        "dataset": "add",
        "template": "chatml",
        "cutoff_len": 64,
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 4,
        "learning_rate": 1.0e-3,
        "max_steps": 2,
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 7,
    }
    values.update(extra)
    return values


def trained_lora_adapter(model_dir, tmp_path) -> str:
    """Train a LoRA adapter on `model_dir` for 3 steps (16 additions, lr 5e-2: it changes the model) and return
    its folder. The caller points HOME at tmp_path (the tokenization cache)."""
    from lathe.llm.commands import run_train
    from lathe.llm.config.train import parse_train_config

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"instruction": f"What is {a} plus {b}?", "output": f"{a + b}"} for a in range(4) for b in range(4)]
    (data / "add.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"add": {"file_name": "add.json"}}))
    run_dir = tmp_path / "run"
    run_train(
        parse_train_config(
            {
                "model_name_or_path": model_dir,
                "stage": "sft",
                "finetuning_type": "lora",
                "dataset_dir": str(data),
                "dataset": "add",
                "template": "chatml",
                "cutoff_len": 32,
                "output_dir": str(run_dir),
                "max_steps": 3,
                "per_device_train_batch_size": 4,
                "learning_rate": 5e-2,
                "report_to": "none",
                "disable_tqdm": True,
                "save_strategy": "no",
                "disable_gradient_checkpointing": True,
            }
        )
    )
    return str(run_dir)
