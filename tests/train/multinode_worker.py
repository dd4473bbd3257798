"""A training job for tests/train/test_multinode.py, run on each simulated node under its own torchrun:
ddp_worker's model and data, with checkpoints, a record of what this process wrote into the shared
output_dir, a crash on demand and a resume from the last checkpoint."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from lathe import Trainer, TrainerCallback, TrainingArguments
from lathe.train.checkpoints.layout import get_last_checkpoint
from tests.train.ddp_worker import TokenModel, dataset


def record_writes(output_dir: str, record: Path) -> None:
    """Log every file opened for writing, folder made or renamed under output_dir by this process:
    Python's audit events (open, os.mkdir, os.rename) and the two writers that bypass them in C++
    (torch.save, safetensors' save_model)."""
    root = os.path.abspath(output_dir)
    written: list[str] = []

    def note(path) -> None:
        path = os.path.abspath(os.fsdecode(path))
        if path == root or path.startswith(root + os.sep):
            written.append(os.path.relpath(path, root))

    def recording(save, path_position: int):
        def wrapper(*args, **kwargs):
            note(args[path_position])
            return save(*args, **kwargs)

        return wrapper

    import safetensors.torch

    torch.save = recording(torch.save, 1)
    safetensors.torch.save_model = recording(safetensors.torch.save_model, 1)

    def hook(event, event_args):
        if event == "open" and event_args[0] is not None and isinstance(event_args[0], (str, bytes, os.PathLike)):
            path, mode = os.fsdecode(event_args[0]), event_args[1]
            flags = event_args[2] if len(event_args) > 2 else 0
            writing = (mode and any(char in str(mode) for char in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            )
            if writing:
                note(path)
        elif event == "os.mkdir" and isinstance(event_args[0], (str, bytes, os.PathLike)):
            note(event_args[0])
        elif event == "os.rename":
            note(event_args[0]), note(event_args[1])

    sys.addaudithook(hook)
    import atexit

    atexit.register(lambda: record.write_text(json.dumps(sorted(set(written)))))


class CrashAt(TrainerCallback):
    """Kill this process (no clean-up, as a lost node) when the given global step ends."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os._exit(17)


def run(output_dir: str, options: dict) -> dict:
    rank = int(os.environ.get("RANK", "0"))
    if options.get("record"):
        record_writes(output_dir, Path(options["record"]) / f"writes-{rank}.json")
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=options["batch"],
        num_train_epochs=options.get("epochs", 2),
        learning_rate=0.1,
        logging_steps=1,
        save_strategy="steps" if options.get("save_steps") else "no",
        save_steps=options.get("save_steps") or 500,
        save_on_each_node=options.get("save_on_each_node", False),
        ddp_timeout=options.get("ddp_timeout", 1800),
        report_to="none",
        disable_tqdm=True,
        seed=3,
        use_cpu=True,
        dataloader_pin_memory=False,
    )
    resume = get_last_checkpoint(output_dir) if options.get("resume") and os.path.isdir(output_dir) else None
    callbacks = []
    if options.get("crash_rank") == rank and options.get("crash_step") and resume is None:  # the first attempt
        callbacks.append(CrashAt(options["crash_step"]))
    trainer = Trainer(model=TokenModel(), args=args, train_dataset=dataset(32), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return {
        "weights": {k: v.tolist() for k, v in trainer.model.state_dict().items()},
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "world_size": args.world_size,
        "rank": args.process_index,
        "resumed_from": resume,
        "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    }


if __name__ == "__main__":
    from tests.train.torchrun_helpers import worker_main

    worker_main(run)
