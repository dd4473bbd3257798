"""Shared by the webui tests: a root folder with the tiny model, an alpaca dataset and its dataset_info.json."""

from __future__ import annotations

import json
import random
import shutil


def make_root(folder, model_dir) -> str:
    """root/models/tiny (the model), root/data (add.json registered as `add`)."""
    shutil.copytree(model_dir, folder / "models" / "tiny")
    data = folder / "data"
    data.mkdir()
    rng = random.Random(0)
    rows = []
    for _ in range(40):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"instruction": f"What is {a} plus {b}?", "input": "", "output": f"{a} plus {b} is {a + b}."})
    (data / "add.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"add": {"file_name": "add.json"}}))
    return str(folder)


def train_form(output_dir: str = "saves/run1", **values) -> dict:
    """What the Train form sends for a short LoRA run of the tiny model."""
    fields = {
        "model_name_or_path": "models/tiny",
        "template": "chatml",
        "stage": "sft",
        "dataset_dir": "data",
        "dataset": "add",
        "output_dir": output_dir,
        "cutoff_len": "32",
        "per_device_train_batch_size": "4",
        "gradient_accumulation_steps": "1",
        "learning_rate": "1e-3",
        "logging_steps": "1",
        "save_steps": "1000",
    }
    fields.update(values)
    return {"method": "lora", "values": fields, "extra": "max_steps: 6\ndisable_tqdm: true\nseed: 7\n"}
