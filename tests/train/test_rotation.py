"""save_total_limit deletes only what lathe can prove it wrote: complete checkpoint-N folders whose
lathe_checkpoint.json says step N. A symbolic link, a folder without the manifest (transformers' or
a person's), an incomplete folder or a renamed copy is neither counted nor deleted, get_last_checkpoint
does not follow a link, and the checkpoint just saved is never deleted, whatever its number."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from lathe.train.checkpoints import layout as ckpt
from lathe.train.checkpoints import rotation
from tests.train import crash_worker


def trainer_for(output_dir: Path, synchronous: bool = False, **arguments):
    options = {"max_steps": 6, "save_steps": 2, "save_total_limit": 1}
    options.update(arguments)
    trainer_kwargs = dict(options.pop("trainer_kwargs", {}))
    callbacks = trainer_kwargs.pop("callbacks", ())
    trainer = crash_worker.build_trainer(str(output_dir), {"args": options}, callbacks, **trainer_kwargs)
    if synchronous:
        # A subclass that overrides save_model saves in the loop, not in the commit thread.
        class SavesInTheLoop(type(trainer)):
            def save_model(self, output_dir=None, _internal_call=False):
                return super().save_model(output_dir, _internal_call)

        trainer.__class__ = SavesInTheLoop
    return trainer


def names(output_dir: Path) -> list[str]:
    return sorted(name for name in os.listdir(output_dir) if name.startswith("checkpoint-"))


def tree(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def fake_checkpoint(folder: Path, step: int) -> Path:
    """A complete lathe checkpoint of `step` (manifest and trainer state), written as lathe writes them."""
    final = folder / f"checkpoint-{step}"
    with ckpt.atomic_checkpoint(str(final)) as staging:
        Path(staging, ckpt.TRAINER_STATE_NAME).write_text(json.dumps({"global_step": step}))
        Path(staging, ckpt.WEIGHTS_NAME).write_bytes(b"w" * 16)
    return final


def another_runs_checkpoint(tmp_path: Path) -> Path:
    """checkpoint-6 of a complete run in another folder."""
    other = tmp_path / "other-run"
    trainer_for(other, save_total_limit=None).train()
    return other / "checkpoint-6"


@pytest.mark.parametrize("synchronous", [False, True], ids=["background commit", "save in the loop"])
def test_a_symlinked_checkpoint_is_neither_counted_nor_deleted_nor_resumed_from(tmp_path, synchronous, caplog):
    target = another_runs_checkpoint(tmp_path)
    before = tree(target)
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / "checkpoint-999").symlink_to(target, target_is_directory=True)
    with caplog.at_level(logging.WARNING):
        trainer_for(output_dir, synchronous).train()
    # The link was the "newest" and every real checkpoint went, the one just saved included.
    assert names(output_dir) == ["checkpoint-6", "checkpoint-999"]
    assert (output_dir / "checkpoint-999").is_symlink() and tree(target) == before
    assert ckpt.get_last_checkpoint(str(output_dir)) == str(output_dir / "checkpoint-6")
    assert any("checkpoint-999" in r.getMessage() and "symbolic link" in r.getMessage() for r in caplog.records)


def test_get_last_checkpoint_does_not_follow_a_symlink_but_an_explicit_path_resumes_from_it(tmp_path, caplog):
    target = another_runs_checkpoint(tmp_path)
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / "checkpoint-6").symlink_to(target, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="lathe.train.checkpoints.layout"):
        assert ckpt.get_last_checkpoint(str(output_dir)) is None
    assert "resume_from_checkpoint" in caplog.text and str(target) in caplog.text
    trainer = trainer_for(output_dir, max_steps=8)
    trainer.train(resume_from_checkpoint=str(output_dir / "checkpoint-6"))
    assert trainer.state.global_step == 8


@pytest.mark.parametrize("synchronous", [False, True], ids=["background commit", "save in the loop"])
def test_a_stray_higher_numbered_folder_is_not_the_newest_and_is_kept(tmp_path, synchronous):
    output_dir = tmp_path / "out"
    stray = output_dir / "checkpoint-500"
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("my notes")
    trainer_for(output_dir, synchronous).train()
    assert names(output_dir) == ["checkpoint-500", "checkpoint-6"]
    assert (stray / "notes.txt").read_text() == "my notes"
    assert ckpt.get_last_checkpoint(str(output_dir)) == str(output_dir / "checkpoint-6")


def test_a_renamed_copy_of_a_checkpoint_is_neither_rotated_nor_resumed_from(tmp_path, caplog):
    output_dir = tmp_path / "out"
    trainer_for(output_dir, max_steps=2).train()
    shutil.copytree(output_dir / "checkpoint-2", output_dir / "checkpoint-900")  # a backup, say
    with caplog.at_level(logging.WARNING, logger="lathe.train.checkpoints.layout"):
        assert ckpt.get_last_checkpoint(str(output_dir)) == str(output_dir / "checkpoint-2")
    assert "checkpoint-900" in caplog.text and "step 2" in caplog.text
    trainer_for(output_dir, max_steps=6).train(resume_from_checkpoint=True)
    assert names(output_dir) == ["checkpoint-6", "checkpoint-900"]


def test_checkpoints_without_a_manifest_are_never_deleted_nor_counted(tmp_path):
    """Checkpoints written by transformers carry no lathe_checkpoint.json: lathe cannot prove it wrote
    them, so rotation leaves them, and still keeps save_total_limit of its own."""
    output_dir = tmp_path / "out"
    trainer_for(output_dir, max_steps=2, save_total_limit=None).train()
    (output_dir / "checkpoint-2" / ckpt.MANIFEST_NAME).unlink()  # now in transformers' form
    before = tree(output_dir / "checkpoint-2")
    trainer_for(output_dir, max_steps=8, save_total_limit=2).train(resume_from_checkpoint=True)
    assert names(output_dir) == ["checkpoint-2", "checkpoint-6", "checkpoint-8"]
    assert tree(output_dir / "checkpoint-2") == before


def test_best_model_and_rotation_leave_foreign_folders_alone(tmp_path):
    """save_total_limit=1 with a distinct best keeps the best and the newest while training, and only
    the best at the end (transformers' rule); a stray folder is in neither count and stays."""
    scores = {2: 5.0, 4: 1.0, 6: 2.0}
    holder, seen = {}, {}

    class Lists(crash_worker.TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            holder["trainer"]._checkpoint_commits.wait()
            seen[state.global_step] = names(Path(args.output_dir))

    output_dir = tmp_path / "out"
    stray = output_dir / "checkpoint-100"
    stray.mkdir(parents=True)
    (stray / "keep.txt").write_text("x")
    trainer = trainer_for(
        output_dir,
        eval_strategy="steps",
        eval_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="score",
        greater_is_better=True,
        trainer_kwargs={
            "eval_dataset": crash_worker.dataset(8),
            "callbacks": [Lists()],
            "compute_metrics": lambda prediction: {"score": scores[holder["trainer"].state.global_step]},
        },
    )
    holder["trainer"] = trainer
    trainer.train()
    assert seen == {
        2: ["checkpoint-100", "checkpoint-2"],
        4: ["checkpoint-100", "checkpoint-2", "checkpoint-4"],
        6: ["checkpoint-100", "checkpoint-2", "checkpoint-6"],
    }
    assert names(output_dir) == ["checkpoint-100", "checkpoint-2"]
    assert (stray / "keep.txt").read_text() == "x"


def test_the_checkpoint_just_saved_is_kept_whatever_its_number(tmp_path):
    """A new run in an output_dir that holds a finished run's checkpoints: the new checkpoint-2 is
    the newest, though the old run's numbers are higher."""
    for step in (8, 10):
        fake_checkpoint(tmp_path, step)
    newest = fake_checkpoint(tmp_path, 2)
    deleted = rotation.rotate_checkpoints(str(tmp_path), 2, None, newest=str(newest))
    assert deleted == [str(tmp_path / "checkpoint-8")]
    assert names(tmp_path) == ["checkpoint-10", "checkpoint-2"]
    # With the best distinct and a limit of 1: the best and the newest stay.
    fake_checkpoint(tmp_path, 4)
    rotation.rotate_checkpoints(
        str(tmp_path), 1, str(tmp_path / "checkpoint-10"), newest=str(tmp_path / "checkpoint-4")
    )
    assert names(tmp_path) == ["checkpoint-10", "checkpoint-4"]


def test_incomplete_folders_are_not_lathes_to_delete(tmp_path, caplog):
    for step in (1, 2, 3):
        fake_checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-1" / ckpt.WEIGHTS_NAME).write_bytes(b"cut")  # not the size its manifest says
    (tmp_path / "checkpoint-9").write_text("a file, not a folder")
    with caplog.at_level(logging.WARNING, logger="lathe.train.checkpoints.rotation"):
        assert rotation.rotate_checkpoints(str(tmp_path), 1, None, newest=str(tmp_path / "checkpoint-3")) == [
            str(tmp_path / "checkpoint-2")
        ]
        rotation.rotate_checkpoints(str(tmp_path), 1, None, newest=str(tmp_path / "checkpoint-3"))
    assert names(tmp_path) == ["checkpoint-1", "checkpoint-3", "checkpoint-9"]
    reports = [r.getMessage() for r in caplog.records]
    assert len([m for m in reports if "checkpoint-1 " in m]) == 1  # once, not at every save
    assert any("checkpoint-1 " in m and "model.safetensors has 3 bytes" in m for m in reports)


def test_delete_checkpoint_never_deletes_a_link_or_what_it_leads_to(tmp_path):
    target = fake_checkpoint(tmp_path / "elsewhere", 3)
    link = tmp_path / "checkpoint-3"
    link.symlink_to(target, target_is_directory=True)
    rotation.delete_checkpoint(str(link))
    assert link.is_symlink() and (target / ckpt.WEIGHTS_NAME).exists()


def test_a_foreign_folder_where_a_checkpoint_is_saved_is_moved_aside_not_deleted(tmp_path, caplog):
    output_dir = tmp_path / "out"
    mine = output_dir / "checkpoint-4"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    target = fake_checkpoint(tmp_path / "elsewhere", 6)
    (output_dir / "checkpoint-6").symlink_to(target, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="lathe.train.checkpoints.layout"):
        trainer_for(output_dir, save_total_limit=None).train()
    assert (output_dir / "checkpoint-4.replaced-1" / "notes.txt").read_text() == "mine"
    assert (output_dir / "checkpoint-6.replaced-1").is_symlink() and (target / ckpt.WEIGHTS_NAME).exists()
    assert names(output_dir) == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-4.replaced-1",
        "checkpoint-6",
        "checkpoint-6.replaced-1",
    ]
    assert all(ckpt.is_complete_checkpoint(str(output_dir / f"checkpoint-{step}")) for step in (2, 4, 6))
    assert "moved to" in caplog.text
