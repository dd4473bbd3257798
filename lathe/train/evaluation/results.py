"""What a run writes and prints about itself at the user's request: trainer_state.json (save_state),
{split}_results.json and all_results.json (save_metrics), and the metrics table (log_metrics), as
transformers writes them. The functions are Trainer's methods of the same name (trainer.py lists them)."""

from __future__ import annotations

import json
import math
import os

from lathe.train.checkpoints import layout as ckpt


def save_state(trainer) -> None:
    args = trainer.args
    if args.should_save:
        os.makedirs(args.output_dir, exist_ok=True)
        trainer.state.save_to_json(os.path.join(args.output_dir, ckpt.TRAINER_STATE_NAME))


def save_metrics(trainer, split: str, metrics: dict, combined: bool = True) -> None:
    """{split}_results.json, and all_results.json merged across splits (transformers' files)."""
    args = trainer.args
    if not args.should_save:
        return
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, f"{split}_results.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=4, sort_keys=True)
    if combined:
        path = os.path.join(args.output_dir, "all_results.json")
        merged = {}
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                merged = json.load(f)
        merged.update(metrics)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(merged, f, indent=4, sort_keys=True)


def metrics_format(metrics: dict) -> dict:
    formatted = dict(metrics)
    for key, value in formatted.items():
        if "_mem_" in key:
            formatted[key] = f"{value >> 20}MB"
        elif "_runtime" in key:
            formatted[key] = _format_seconds(value)
        elif key == "total_flos":
            formatted[key] = f"{int(value) >> 30}GF"
        elif isinstance(value, float):
            formatted[key] = round(value, 4)
    return formatted


def log_metrics(trainer, split: str, metrics: dict) -> None:
    """Print the metrics as transformers does (rank 0 only)."""
    if not trainer.is_world_process_zero():
        return
    formatted = trainer.metrics_format(metrics)
    print(f"***** {split} metrics *****")
    width = max((len(k) for k in formatted), default=0)
    for key in sorted(formatted):
        print(f"  {key: <{width}} = {formatted[key]:>9}")


def _format_seconds(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}.{int(round((seconds - math.floor(seconds)) * 100)):02d}"
