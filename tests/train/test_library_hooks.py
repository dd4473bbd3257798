"""What libraries built on transformers' Trainer rely on (issue 38): lathe.patch_transformers() puts lathe's
classes in transformers' place, and the private hooks their subclasses override (_save, _load_best_model,
_load_from_checkpoint, _set_signature_columns_if_needed) are called where transformers calls them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lathe import Trainer
from tests.train.torchrun_helpers import REPOSITORY
from tests.train.trainer_helpers import Regression, regression_items, training_args

PATCHED = r"""
import sys
import lathe
replaced = lathe.patch_transformers()
import transformers
from transformers import Trainer, TrainingArguments, Seq2SeqTrainer, TrainerCallback
from transformers.trainer import Trainer as ModuleTrainer
from transformers.trainer_callback import TrainerCallback as ModuleCallback
from transformers.training_args import TrainingArguments as ModuleArguments
assert Trainer is ModuleTrainer is lathe.Trainer, Trainer
assert TrainingArguments is ModuleArguments is lathe.TrainingArguments
assert Seq2SeqTrainer is lathe.Seq2SeqTrainer and TrainerCallback is ModuleCallback is lathe.TrainerCallback
assert transformers.DataCollatorWithPadding is lathe.DataCollatorWithPadding
assert transformers.set_seed is lathe.set_seed and transformers.get_scheduler is lathe.get_scheduler
assert transformers.PreTrainedModel.__module__.startswith("transformers")  # models stay transformers'
assert lathe.patch_transformers() == {}  # a second call has nothing left to replace
print(sum(len(names) for names in replaced.values()))
"""


def test_patch_transformers_replaces_the_trainer_side_everywhere():
    pytest.importorskip("transformers")
    env = dict(os.environ, PYTHONPATH=str(REPOSITORY))
    done = subprocess.run([sys.executable, "-c", PATCHED], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 40  # Trainer, arguments, callbacks, collators, schedules, utilities


def test_patch_transformers_after_a_library_import_is_an_error():
    pytest.importorskip("transformers")
    code = "import sys, types; sys.modules['trl'] = types.ModuleType('trl'); import lathe; lathe.patch_transformers()"
    env = dict(os.environ, PYTHONPATH=str(REPOSITORY))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "must run before importing trl" in done.stderr


class OwnLayout(Trainer):
    """A subclass writing its own files (as sentence-transformers' _save) and loading them back."""

    loaded = []

    def _save(self, output_dir=None, state_dict=None):
        os.makedirs(output_dir, exist_ok=True)
        torch.save(self.model.state_dict(), os.path.join(output_dir, "own.pt"))

    def _load_from_checkpoint(self, checkpoint_path, model=None):
        self.loaded.append(os.path.basename(checkpoint_path))
        self.model.load_state_dict(torch.load(os.path.join(checkpoint_path, "own.pt"), weights_only=True))


def test_save_and_best_model_go_through_the_subclass_hooks(tmp_path):
    args = training_args(
        tmp_path,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        load_best_model_at_end=True,
    )
    data = regression_items(8)
    trainer = OwnLayout(model=Regression(), args=args, train_dataset=data, eval_dataset=data)
    trainer.train()
    for step in (2, 4):
        files = sorted(os.listdir(tmp_path / f"checkpoint-{step}"))
        assert "own.pt" in files and "model.safetensors" not in files  # the subclass's layout, in the checkpoints
    best = os.path.basename(trainer.state.best_model_checkpoint)
    assert OwnLayout.loaded == [best]  # load_best_model_at_end through _load_best_model -> _load_from_checkpoint
    saved = torch.load(tmp_path / best / "own.pt", weights_only=True)
    torch.testing.assert_close(trainer.model.state_dict(), saved)
    trainer.save_model(str(tmp_path / "final"))
    assert os.listdir(tmp_path / "final") == ["own.pt"]


def test_signature_columns_hook_decides_what_reaches_the_model(tmp_path):
    """TRL names its own columns in _set_signature_columns_if_needed; the others are removed."""
    seen = []

    class Columns(Trainer):
        def _set_signature_columns_if_needed(self):
            if self._signature_columns is None:
                self._signature_columns = ["x", "labels", "keep"]

    class Model(Regression):
        def forward(self, x, labels=None, **extra):
            seen.append(sorted(set(extra) - {"num_items_in_batch"}))
            return super().forward(x, labels)

    items = [{**item, "keep": 1.0, "drop": 2.0} for item in regression_items(4)]
    trainer = Columns(model=Model(), args=training_args(tmp_path, max_steps=1), train_dataset=items)
    trainer.train()
    assert seen == [["keep"]]
    plain = Trainer(model=Regression(), args=training_args(tmp_path / "plain", max_steps=1), train_dataset=items)
    plain._set_signature_columns_if_needed()
    assert plain._signature_columns[:2] == ["x", "labels"] and "drop" not in plain._signature_columns
