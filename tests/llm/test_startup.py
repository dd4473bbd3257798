"""lathe/llm/launch/startup.py: `lathe train` starts without the collector's full scans and trains with Python's
own thresholds, start-up's objects frozen out of the scans."""

from __future__ import annotations

import gc
import os

import pytest
import yaml

from lathe.llm.launch.startup import FULL_SCANS_HELD, StartupCollector
from tests.llm.webui_fixtures import make_root, train_form


@pytest.fixture
def thresholds():
    """Python's thresholds before the test, and back after it whatever happened."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_full_scans_are_held_until_training_begins_then_python_s_thresholds_are_back(thresholds):
    frozen = gc.get_freeze_count()
    with StartupCollector() as startup:
        assert gc.get_threshold() == (thresholds[0], thresholds[1], FULL_SCANS_HELD)  # young ones as before
        startup.on_train_begin(None, None, None)
        assert gc.get_threshold() == thresholds
        assert gc.get_freeze_count() > frozen  # start-up's objects: out of the scans
        gc.set_threshold(5000, 20, 20)  # what the training code sets afterwards is its own
        startup.on_train_begin(None, None, None)  # once only (auto_find_batch_size begins again)
        assert gc.get_threshold() == (5000, 20, 20)
    assert gc.get_threshold() == (5000, 20, 20)


def test_a_start_that_never_trains_gets_python_s_thresholds_back(thresholds):
    with pytest.raises(ValueError), StartupCollector():
        raise ValueError("a config error before training")
    assert gc.get_threshold() == thresholds


@pytest.mark.slow
def test_lathe_train_trains_with_python_s_thresholds(tmp_path, tiny_model_dir, monkeypatch, thresholds):
    from lathe.cli import main
    from lathe.train.callbacks.events import TrainerCallback
    from lathe.train.trainer import Trainer

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    root = make_root(tmp_path / "root", tiny_model_dir)
    form = train_form()
    config = {**form["values"], **yaml.safe_load(form["extra"]), "finetuning_type": "lora", "max_steps": 2}
    for key in ("model_name_or_path", "dataset_dir", "output_dir"):
        config[key] = os.path.join(root, config[key])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))

    seen = []

    class Thresholds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(gc.get_threshold())

    original_init = Trainer.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.add_callback(Thresholds())

    monkeypatch.setattr(Trainer, "__init__", init)
    assert main(["train", str(tmp_path / "c.yaml")]) == 0
    assert seen == [thresholds, thresholds]  # every step under Python's own thresholds
    assert gc.get_threshold() == thresholds
