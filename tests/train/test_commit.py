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
import torch

from lathe.train.checkpoints import layout as ckpt
from lathe.train.checkpoints.commit import BackgroundCommitter
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


# ----- what the user sees when a save fails: lathe's message last -----

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (writes fail with ENOSPC)")


def printed_traceback(error: BaseException) -> list[str]:
    """The lines Python prints for the uncaught error, chained causes first."""
    import traceback

    return "".join(traceback.format_exception(error)).rstrip().splitlines()


def torch_save_to_a_full_disk(monkeypatch, fragment: str) -> None:
    """torch.save of any file whose path contains `fragment` writes to /dev/full instead: the real
    error torch gives for a full disk."""
    real = torch.save

    def save(obj, path, *args, **kwargs):
        return real(obj, "/dev/full" if fragment in os.fspath(path) else path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


@needs_dev_full
@pytest.mark.parametrize("synchronous", [False, True], ids=["background commit", "save in the loop"])
def test_a_full_disk_mid_save_ends_the_traceback_with_lathes_message(tmp_path, monkeypatch, synchronous):
    torch_save_to_a_full_disk(monkeypatch, os.path.join(".staging-checkpoint-4", ckpt.SCHEDULER_NAME))
    trainer = trainer_for(tmp_path / "out")
    if synchronous:

        class SavesInTheLoop(type(trainer)):
            def save_model(self, output_dir=None, _internal_call=False):
                return super().save_model(output_dir, _internal_call)

        trainer.__class__ = SavesInTheLoop
    with pytest.raises(RuntimeError) as raised:
        trainer.train()
    last = printed_traceback(raised.value)[-1]
    assert last == (
        f"Saving checkpoint '{tmp_path / 'out' / 'checkpoint-4'}' failed; earlier checkpoints are intact. "
        f"Check free disk space ({ckpt._free_space(str(tmp_path / 'out' / 'checkpoint-4'))}) and that the "
        "output folder is writable."
    )
    assert [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(tmp_path / "out"))] == ["checkpoint-2"]


@needs_dev_full
def test_a_full_disk_in_save_model_ends_the_traceback_with_lathes_message(tmp_path, monkeypatch):
    trainer = trainer_for(tmp_path / "out", max_steps=2, save_steps=2)
    trainer.train()
    torch_save_to_a_full_disk(monkeypatch, ckpt.TRAINING_ARGS_NAME)
    with pytest.raises(RuntimeError) as raised:
        trainer.save_model(str(tmp_path / "final"))
    assert printed_traceback(raised.value)[-1].startswith(
        f"Saving the model to '{tmp_path / 'final'}' failed. Check free disk space ("
    )
