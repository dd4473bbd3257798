"""lathe.trainer_utils.sort_checkpoints and rotate_checkpoints: transformers' functions and arguments.
Sorting lists every checkpoint-N folder as transformers does; rotation decides as transformers does
among lathe's own checkpoints and, unlike it, never deletes a folder lathe cannot prove it wrote unless
the folder is empty."""

from __future__ import annotations

import os

import pytest

from lathe.train.checkpoints import rotation
from lathe.trainer_utils import rotate_checkpoints, sort_checkpoints
from tests.train.test_rotation import fake_checkpoint, names

STEPS = [20, 5, 15, 25, 10]


def steps(paths) -> list[int]:
    return [int(os.path.basename(path).split("-")[1]) for path in paths]


@pytest.mark.hf
@pytest.mark.parametrize("best", [None, 5, 25, 15])
def test_sort_checkpoints_orders_as_transformers(tmp_path, best):
    from transformers import trainer_utils

    for step in STEPS:
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-7.txt").write_text("not a folder")
    best_path = str(tmp_path / f"checkpoint-{best}") if best else None
    ours = sort_checkpoints(str(tmp_path), best_model_checkpoint=best_path)
    assert ours == trainer_utils.sort_checkpoints(str(tmp_path), best_model_checkpoint=best_path)
    expected = {None: [5, 10, 15, 20, 25], 5: [10, 15, 20, 5, 25], 25: [5, 10, 15, 20, 25], 15: [5, 10, 20, 15, 25]}
    assert steps(ours) == expected[best]


def test_sort_checkpoints_by_modification_time(tmp_path):
    for index, step in enumerate(STEPS):
        (tmp_path / f"checkpoint-{step}").mkdir()
        os.utime(tmp_path / f"checkpoint-{step}", (1000 + 10 * index, 1000 + 10 * index))
    assert steps(sort_checkpoints(str(tmp_path), use_mtime=True)) == STEPS
    for step in STEPS:  # times within a second: some filesystems fake them, so order by step instead
        os.utime(tmp_path / f"checkpoint-{step}", (1000, 1000))
    assert steps(sort_checkpoints(str(tmp_path), use_mtime=True)) == sorted(STEPS)


@pytest.mark.hf
@pytest.mark.parametrize("limit, best", [(2, None), (2, 5), (1, 25), (1, 5), (3, 10), (0, None)])
def test_rotate_checkpoints_keeps_what_transformers_keeps_of_lathes_checkpoints(tmp_path, limit, best):
    from transformers import trainer_utils

    for library in ("lathe", "transformers"):
        for step in STEPS:
            fake_checkpoint(tmp_path / library, step)
    for library, rotate in (("lathe", rotate_checkpoints), ("transformers", trainer_utils.rotate_checkpoints)):
        folder = tmp_path / library
        best_path = str(folder / f"checkpoint-{best}") if best else None
        rotate(output_dir=str(folder), save_total_limit=limit, best_model_checkpoint=best_path)
    assert names(tmp_path / "lathe") == names(tmp_path / "transformers")
    assert len(names(tmp_path / "lathe")) == (5 if not limit else max(limit, 2 if best not in (None, 25) else 1))


def test_rotate_checkpoints_never_deletes_a_folder_lathe_did_not_write(tmp_path):
    for step in (5, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()  # transformers' or a person's: no lathe manifest
        (tmp_path / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"weights")
    for step in (15, 20, 25):
        fake_checkpoint(tmp_path, step)
    deleted = rotate_checkpoints(str(tmp_path), save_total_limit=1)
    assert steps(deleted) == [15, 20]
    assert names(tmp_path) == ["checkpoint-10", "checkpoint-25", "checkpoint-5"]
    with pytest.raises(ValueError, match="checkpoint_prefix"):
        rotate_checkpoints(str(tmp_path), save_total_limit=1, checkpoint_prefix="ckpt")


@pytest.mark.hf
@pytest.mark.parametrize("limit, best", [(2, None), (2, 5), (1, 25), (1, 5), (3, 10)])
def test_rotate_checkpoints_deletes_empty_folders_as_transformers(tmp_path, limit, best):
    """An empty checkpoint-N folder holds nothing to lose: rotation counts and deletes those as transformers."""
    from transformers import trainer_utils

    for library, rotate in (("lathe", rotate_checkpoints), ("transformers", trainer_utils.rotate_checkpoints)):
        folder = tmp_path / library
        for step in STEPS:
            (folder / f"checkpoint-{step}").mkdir(parents=True)
        best_path = str(folder / f"checkpoint-{best}") if best else None
        rotate(output_dir=str(folder), save_total_limit=limit, best_model_checkpoint=best_path)
    assert names(tmp_path / "lathe") == names(tmp_path / "transformers")
    expected = {(2, None): [20, 25], (2, 5): [5, 25], (1, 25): [25], (1, 5): [5, 25], (3, 10): [10, 20, 25]}
    assert sorted(steps(names(tmp_path / "lathe"))) == expected[(limit, best)]


def test_empty_folders_go_before_any_checkpoint_that_holds_something(tmp_path):
    """Empty folders are counted but taken as the oldest: a stray empty checkpoint-99 never costs a real one."""
    for step in (10, 20):
        fake_checkpoint(tmp_path, step)
    for step in (99, 98):
        (tmp_path / f"checkpoint-{step}").mkdir()
    deleted = rotate_checkpoints(str(tmp_path), save_total_limit=2, newest=str(tmp_path / "checkpoint-20"))
    assert sorted(steps(deleted)) == [98, 99]
    assert names(tmp_path) == ["checkpoint-10", "checkpoint-20"]
    (tmp_path / "checkpoint-7").mkdir()
    (tmp_path / "checkpoint-7" / "late.txt").write_text("written after the listing")
    assert rotation._remove_empty_folder(str(tmp_path / "checkpoint-7")) is False  # rmdir refuses: nothing is lost
    assert (tmp_path / "checkpoint-7" / "late.txt").read_text() == "written after the listing"


@pytest.mark.hf
@pytest.mark.parametrize(
    "targets, key",
    [
        ("model.layers.0.mlp", "model.layers.0.mlp"),
        (r".*\.mlp\..*", "model.layers.0.mlp.up_proj"),
        (["attn", "mlp"], "model.layers.0.mlp.up_proj"),
        (["q_proj"], "model.layers.0.self_attn.q_proj"),
        ([r".*\.k_proj"], "model.layers.1.self_attn.k_proj"),
        (["embed"], "model.layers.1.self_attn.k_proj"),
    ],
)
def test_check_target_module_exists_matches_transformers(targets, key):
    from transformers import trainer_utils

    from lathe.trainer_utils import check_target_module_exists

    for flag in (False, True):
        assert check_target_module_exists(targets, key, return_is_regex=flag) == (
            trainer_utils.check_target_module_exists(targets, key, return_is_regex=flag)
        )
