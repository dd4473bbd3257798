"""Background checkpoint commits: the flush and rename of a checkpoint overlap the next training
steps, yet every checkpoint is published (complete) before anything reads it, a failed commit is
a clear error, and a run that stops on an exception still publishes its last checkpoint."""
from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from lathe.train import checkpoint as ckpt
from lathe.train.commit import BackgroundCommitter
from tests.train import crash_worker


def trainer_for(output_dir: Path, callbacks=(), **arguments):
    options = {"max_steps": 6, "save_steps": 2, "save_total_limit": None}
    options.update(arguments)
    return crash_worker.build_trainer(str(output_dir), {"args": options}, callbacks=callbacks)


def slow_flushes(monkeypatch, seconds: float) -> list[str]:
    """Make every checkpoint flush take `seconds`; returns the names of the threads that flushed."""
    real, threads = ckpt._fsync_tree, []

    def fsync_tree(folder):
        threads.append(threading.current_thread().name)
        time.sleep(seconds)
        real(folder)

    monkeypatch.setattr(ckpt, "_fsync_tree", fsync_tree)
    return threads


class SeesCheckpoints(crash_worker.TrainerCallback):
    """Records, at each step end, which checkpoints are published."""

    def __init__(self, output_dir: Path):
        self.output_dir, self.seen = output_dir, {}

    def on_step_end(self, args, state, control, **kwargs):
        self.seen[state.global_step] = [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(self.output_dir))]


def test_training_goes_on_while_a_checkpoint_is_flushed_and_train_returns_with_all_published(tmp_path, monkeypatch):
    threads = slow_flushes(monkeypatch, 0.3)
    output_dir = tmp_path / "out"
    seer = SeesCheckpoints(output_dir)
    trainer_for(output_dir, callbacks=[seer]).train()
    assert threads and all(name == "lathe-checkpoint-commit" for name in threads)
    # Step 3 ran while checkpoint-2 was still being flushed (not yet published)...
    assert "checkpoint-2" not in seer.seen[3]
    # ...but the save at step 4 waited for it, and train() returned with every checkpoint complete.
    assert "checkpoint-2" in seer.seen[5]
    names = [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(output_dir))]
    assert names == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert all(ckpt.is_complete_checkpoint(str(output_dir / name)) for name in names)
    assert not [n for n in os.listdir(output_dir) if n.startswith(ckpt.STAGING_PREFIX)]


def test_on_save_listeners_see_the_published_checkpoint(tmp_path, monkeypatch):
    slow_flushes(monkeypatch, 0.2)
    seen = []

    class Opens(crash_worker.TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            path = ckpt.checkpoint_path(args.output_dir, state.global_step)
            seen.append((state.global_step, ckpt.is_complete_checkpoint(path)))

    trainer_for(tmp_path / "out", callbacks=[Opens()]).train()
    assert seen == [(2, True), (4, True), (6, True)]


def test_rotation_runs_after_the_background_rename(tmp_path, monkeypatch):
    slow_flushes(monkeypatch, 0.1)
    output_dir = tmp_path / "out"
    trainer_for(output_dir, save_total_limit=1).train()
    assert [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(output_dir))] == ["checkpoint-6"]


def test_an_exception_in_training_still_publishes_the_last_checkpoint(tmp_path, monkeypatch):
    slow_flushes(monkeypatch, 0.3)

    class Fails(crash_worker.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise RuntimeError("boom")

    output_dir = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom"):
        trainer_for(output_dir, callbacks=[Fails()]).train()
    assert [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(output_dir))] == ["checkpoint-2"]
    assert ckpt.is_complete_checkpoint(str(output_dir / "checkpoint-2"))


def test_a_failed_background_commit_is_raised_at_the_next_wait_and_publishes_nothing(tmp_path, monkeypatch):
    def fails(folder):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ckpt, "_fsync_tree", fails)
    final = tmp_path / "checkpoint-1"
    committer = BackgroundCommitter()
    with ckpt.atomic_checkpoint(str(final), committer=committer) as staging:
        Path(staging, "model.safetensors").write_bytes(b"x")
    with pytest.raises(OSError) as raised:
        committer.wait()
    assert raised.value.errno == errno.EIO and "checkpoint-1" in str(raised.value)
    assert os.listdir(tmp_path) == []  # neither the checkpoint nor its staging folder
    committer.wait()  # the error is raised once
