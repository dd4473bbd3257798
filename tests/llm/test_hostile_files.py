"""Faults on the new inputs end in one clear line: a reward function returning the wrong type or shape, a
resume with another model, a full disk (ENOSPC) or a file size limit (EFBIG) during a checkpoint write."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from lathe.llm.rl.rewards import RewardFunctionError, compute_rewards
from tests.llm.webui_fixtures import make_root, train_form

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _score(function, count: int = 3):
    prompts = [f"p{i}" for i in range(count)]
    inputs = [{"prompt": p} for p in prompts]
    return compute_rewards([function], ["judge"], [None], inputs, prompts, ["c"] * count, [[1]] * count, {})


@pytest.mark.parametrize(
    "returned, says",
    [
        (0.5, "it returned float 0.5."),
        ("1.0", "it returned str '1.0'."),
        ({"a": 1.0}, "it returned dict {'a': 1.0}."),
        ([1.0, 2.0], "it returned 2 values: [1.0, 2.0]."),
        (["yes", "no", "yes"], "item 0 is str 'yes' (in ['yes', 'no', 'yes'])."),
        ([[1.0], [2.0], [3.0]], "item 0 is list [1.0] (in [[1.0], [2.0], [3.0]])."),
    ],
)
def test_a_reward_of_the_wrong_type_or_shape_names_the_function(returned, says):
    with pytest.raises(RewardFunctionError) as caught:
        _score(lambda **kwargs: returned)
    message = str(caught.value)
    assert message.startswith(
        "reward function 'judge' must return a list[float] of 3 rewards (one per completion, None to skip); "
    )
    assert message.endswith(says), message


def test_rewards_trl_accepts_still_pass():
    assert _score(lambda **kwargs: [1, 0.5, None])[:, 0].tolist()[:2] == [1.0, 0.5]
    assert _score(lambda **kwargs: (True, False, True))[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert _score(lambda **kwargs: torch.tensor([0.25, 0.5, 0.75]))[:, 0].tolist() == [0.25, 0.5, 0.75]


@pytest.fixture
def run_root(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return make_root(tmp_path / "root", tiny_model_dir)


def _config(root: str, path, **values) -> str:
    form = train_form(**values)
    config = {key: value for key, value in form["values"].items()}
    config.update(yaml.safe_load(form["extra"]))
    config.update(finetuning_type="lora", do_train=True, max_steps=4, save_steps=2)
    for key in ("model_name_or_path", "dataset_dir", "output_dir"):
        config[key] = os.path.join(root, config[key])
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_resuming_with_another_model_is_refused(run_root, tmp_path, capsys):
    from lathe.cli import main

    config = _config(run_root, tmp_path / "a.yaml")
    assert main(["train", config, "max_steps=2"]) == 0
    other = os.path.join(run_root, "models", "other")
    shutil.copytree(os.path.join(run_root, "models", "tiny"), other)  # (a link to the same folder is the same model)
    capsys.readouterr()
    assert main(["train", config, f"model_name_or_path={other}", "max_steps=4"]) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("lathe train: error:"))
    assert f"with model_name_or_path '{other}', but that run was trained from" in line
    assert "set allow_model_change: true to resume anyway" in line and "Traceback" not in err
    assert main(["train", config, f"model_name_or_path={other}", "max_steps=4", "allow_model_change=true"]) == 0
    assert os.path.isdir(os.path.join(run_root, "saves", "run1", "checkpoint-4"))


def test_a_full_disk_during_a_checkpoint_names_the_file_and_keeps_the_last(run_root, tmp_path, monkeypatch, capsys):
    from lathe.cli import main
    from lathe.train.checkpoints.layout import is_complete_checkpoint

    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        if "checkpoint-4" in str(path) and str(path).endswith("optimizer.pt"):
            with open(path, "wb") as f:
                f.write(b"\0" * 100)  # part of it, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    assert main(["train", _config(run_root, tmp_path / "a.yaml")]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lathe train: error:")]
    output_dir = os.path.join(run_root, "saves", "run1")
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert (
        f"writing {os.path.join(output_dir, 'checkpoint-4', 'optimizer.pt')} failed: No space left on device"
        in (lines[0])
    )
    assert (
        f"checkpoint {os.path.join(output_dir, 'checkpoint-4')} was not saved and earlier checkpoints are intact"
        in (lines[0])
    )
    assert is_complete_checkpoint(os.path.join(output_dir, "checkpoint-2"))
    assert sorted(name for name in os.listdir(output_dir) if "checkpoint" in name) == ["checkpoint-2"]


def test_a_file_size_limit_is_one_line(run_root, tmp_path):
    """A real EFBIG: `lathe train` under RLIMIT_FSIZE (ulimit -f) too small for the checkpoint's weights."""
    config = _config(run_root, tmp_path / "a.yaml")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    run = subprocess.run(
        [sys.executable, "-m", "lathe", "train", config, "lora_rank=64"],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    lines = [line for line in run.stderr.splitlines() if line.startswith("lathe train: error:")]
    assert run.returncode == 2 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "File too large" in lines[0] and "checkpoint-2" in lines[0], lines[0]
    assert "earlier checkpoints are intact" in lines[0]
    assert not any("checkpoint" in name for name in os.listdir(os.path.join(run_root, "saves", "run1")))
