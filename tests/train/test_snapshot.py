"""Checkpoints written from a copy of the state (lathe.train.checkpoints.snapshot) in the commit thread: the
files are the same as a synchronous save's, training that goes on meanwhile cannot leak into them,
and the cases that must save in the loop (several processes, an overridden save_model, too little
memory for a copy) do."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from lathe import Trainer, TrainingArguments
from lathe.train.checkpoints import layout as ckpt
from lathe.train.checkpoints import loading, snapshot
from lathe.train.checkpoints import weights as weights_io
from tests.train import crash_worker


def trainer_for(output_dir: Path, callbacks=(), trainer_class=None, **arguments):
    options = {"max_steps": 6, "save_steps": 2, "save_total_limit": None}
    options.update(arguments)
    trainer = crash_worker.build_trainer(str(output_dir), {"args": options}, callbacks=callbacks)
    if trainer_class is not None:
        trainer.__class__ = trainer_class
    return trainer


def slow_writes(monkeypatch, seconds: float) -> list[str]:
    """Delay every background write of a checkpoint's files; returns the writing threads' names."""
    real, threads = snapshot.CheckpointContents.write, []

    def write(self, model, folder, rng_name):
        threads.append(threading.current_thread().name)
        time.sleep(seconds)
        real(self, model, folder, rng_name)

    monkeypatch.setattr(snapshot.CheckpointContents, "write", write)
    return threads


class RecordsWeights(crash_worker.TrainerCallback):
    """The weights at the end of every step (what the save at that step must hold)."""

    def __init__(self):
        self.weights = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_training_after_the_copy_does_not_reach_the_files(tmp_path, monkeypatch):
    threads = slow_writes(monkeypatch, 0.3)  # steps 3, 4 run while checkpoint-2 is being written
    recorder = RecordsWeights()
    output_dir = tmp_path / "out"
    trainer_for(output_dir, callbacks=[recorder]).train()
    assert threads and set(threads) == {"lathe-checkpoint-commit"}
    for step in (2, 4, 6):
        saved = load_file(str(output_dir / f"checkpoint-{step}" / ckpt.WEIGHTS_NAME))
        assert saved.keys() == recorder.weights[step].keys()
        for name, tensor in saved.items():
            assert torch.equal(tensor, recorder.weights[step][name]), (step, name)
    # the test can fail: the weights moved between the saves
    assert any(not torch.equal(recorder.weights[2][name], recorder.weights[4][name]) for name in recorder.weights[2])


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != ckpt.MANIFEST_NAME}


def test_background_and_synchronous_saves_write_the_same_files(tmp_path, monkeypatch):
    trainer_for(tmp_path / "background", max_steps=2).train()
    monkeypatch.setattr(snapshot, "_free_memory_bytes", lambda: 1)  # no room for a copy: save in the loop
    trainer_for(tmp_path / "loop", max_steps=2).train()
    background, loop = files_of(tmp_path / "background" / "checkpoint-2"), files_of(tmp_path / "loop" / "checkpoint-2")
    assert (
        background.keys()
        == loop.keys()
        >= {
            ckpt.WEIGHTS_NAME,
            ckpt.OPTIMIZER_NAME,
            ckpt.SCHEDULER_NAME,
            "rng_state.pth",
            ckpt.TRAINER_STATE_NAME,
            ckpt.TRAINING_ARGS_JSON,
        }
    )
    for name in (ckpt.WEIGHTS_NAME, ckpt.TRAINER_STATE_NAME):
        assert background[name] == loop[name], name
    optimizer = [
        loading.safe_torch_load(str(tmp_path / run / "checkpoint-2" / ckpt.OPTIMIZER_NAME))
        for run in ("background", "loop")
    ]
    assert optimizer[0]["param_groups"] == optimizer[1]["param_groups"]
    for index, state in optimizer[0]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, optimizer[1]["state"][index][key]), (index, key)


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight (as in tied-embedding LMs)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 4)
        self.head = nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight
        self.norm = nn.LayerNorm(4)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.norm(self.embed(input_ids)))
        return (nn.functional.cross_entropy(logits.view(-1, 11), labels.view(-1)), logits)


def test_a_copy_keeps_tied_weights_tied_and_references_frozen_ones():
    model = Tied()
    model.norm.weight.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    entries = {name: tensor for name, tensor, _frozen in snapshot._model_entries(model)}
    memo = {}
    copied = {
        name: tensor if frozen else snapshot._copy_tensor(tensor, memo)
        for name, tensor, frozen in snapshot._model_entries(model)
    }
    assert copied["embed.weight"].data_ptr() == copied["head.weight"].data_ptr() != entries["embed.weight"].data_ptr()
    assert copied["norm.weight"].data_ptr() == model.norm.weight.data_ptr()  # frozen: referenced
    assert copied["norm.bias"].data_ptr() != model.norm.bias.data_ptr()
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    assert not torch.equal(copied["embed.weight"], model.embed.weight)
    assert snapshot.copy_fits_in_memory(model, optimizer)


def test_tied_weights_saved_from_a_copy_are_stored_once_and_load_back(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        save_steps=2,
        per_device_train_batch_size=2,
        report_to="none",
        disable_tqdm=True,
        learning_rate=0.1,
    )
    data = [
        {"input_ids": torch.tensor([i % 11, (i + 1) % 11]), "labels": torch.tensor([(i + 1) % 11, (i + 2) % 11])}
        for i in range(8)
    ]
    torch.manual_seed(0)
    trainer = Trainer(model=Tied(), args=args, train_dataset=data)
    trainer.train()
    saved = load_file(str(tmp_path / "out" / "checkpoint-2" / ckpt.WEIGHTS_NAME))
    assert len([k for k in saved if k in ("embed.weight", "head.weight")]) == 1
    fresh = Tied()
    weights_io.load_model_weights(fresh, str(tmp_path / "out" / "checkpoint-2"))
    assert fresh.head.weight is fresh.embed.weight
    assert torch.equal(fresh.embed.weight, trainer.model.embed.weight)


class OwnSaveModel(Trainer):
    calls: list = []

    def save_model(self, output_dir=None, _internal_call=False):
        OwnSaveModel.calls.append((threading.current_thread().name, Path(output_dir).name))
        super().save_model(output_dir, _internal_call)


def test_an_overridden_save_model_is_called_in_the_loop_for_every_checkpoint(tmp_path):
    OwnSaveModel.calls = []
    trainer_for(tmp_path / "out", trainer_class=OwnSaveModel).train()
    main_thread = threading.main_thread().name
    assert OwnSaveModel.calls == [(main_thread, f"{ckpt.STAGING_PREFIX}checkpoint-{s}") for s in (2, 4, 6)]
    assert all(ckpt.is_complete_checkpoint(str(tmp_path / "out" / f"checkpoint-{s}")) for s in (2, 4, 6))


def test_a_failed_background_write_is_a_clear_error_and_publishes_nothing(tmp_path, monkeypatch):
    real = snapshot.CheckpointContents.write

    def write(self, model, folder, rng_name):
        if folder.endswith("checkpoint-4"):
            raise OSError(28, "No space left on device")
        real(self, model, folder, rng_name)

    monkeypatch.setattr(snapshot.CheckpointContents, "write", write)
    output_dir = tmp_path / "out"
    with pytest.raises(OSError) as raised:
        trainer_for(output_dir).train()
    message = "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
    assert "checkpoint-4" in message and "disk space" in message, message
    assert [p.name for p in output_dir.iterdir() if p.name.startswith("checkpoint")] == ["checkpoint-2"]
    assert not [p for p in output_dir.iterdir() if p.name.startswith(ckpt.STAGING_PREFIX)]
