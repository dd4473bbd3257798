"""Checkpoints and scripts from before lathe's folders by concern keep working: a training_args.bin pickled by
lathe at main 8c2bdee (class paths lathe.train.args, lathe.train.args_enums, lathe.train.args_integrations)
loads into today's classes, and every old module path imports as the module that took its place."""

import importlib
import pathlib

import pytest
import torch

import lathe
from lathe import _moved

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def test_training_args_bin_written_before_the_move_loads():
    args = torch.load(FIXTURES / "training_args_before_folders.bin", weights_only=False)
    assert type(args) is lathe.TrainingArguments
    assert args.learning_rate == 3e-4 and args.save_steps == 7
    assert args.lr_scheduler_type == lathe.SchedulerType.COSINE and args.save_strategy == lathe.SaveStrategy.STEPS
    assert args.optim == lathe.OptimizerNames.ADAMW_TORCH
    seq2seq = torch.load(FIXTURES / "seq2seq_training_args_before_folders.bin", weights_only=False)
    assert type(seq2seq) is lathe.Seq2SeqTrainingArguments and seq2seq.predict_with_generate is True


def test_training_args_bin_round_trips_today(tmp_path):
    torch.save(lathe.TrainingArguments(output_dir="out", save_steps=3, report_to="none"), tmp_path / "a.bin")
    assert torch.load(tmp_path / "a.bin", weights_only=False).save_steps == 3


@pytest.mark.parametrize("old, new", sorted(_moved.MOVED.items()))
def test_old_module_paths_import_the_moved_module(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_moved_targets_exist_and_old_paths_are_gone():
    root = pathlib.Path(lathe.__file__).parent.parent
    for old, new in _moved.MOVED.items():
        assert not (root / (old.replace(".", "/") + ".py")).exists(), old
        new_path = root / new.replace(".", "/")
        assert new_path.with_suffix(".py").is_file() or (new_path / "__init__.py").is_file(), new
