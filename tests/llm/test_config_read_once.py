"""`lathe train` reads its config file once per command and passes the values on: the launch keys, the Ray
keys, the hub lookup before the ranks start and the TrainConfig all come from that one read (each rank of a
torchrun or Ray launch is a command of its own and reads the file once too). Counted with Python's audit
hook on `open`, which sees every way a file is opened."""

from __future__ import annotations

import json
import os
import sys

import pytest

OPENED: list[str] | None = None  # the paths opened while a test counts, else None


def _record(event: str, args) -> None:
    if event == "open" and OPENED is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_record)  # an audit hook cannot be removed: it records only while OPENED is a list


def count_opens(path: str, run) -> tuple[object, int]:
    """(what run() returned, how many times it opened `path`)."""
    global OPENED
    OPENED = []
    try:
        result = run()
        return result, OPENED.count(os.path.realpath(path))
    finally:
        OPENED = None


@pytest.fixture
def config(tmp_path, tiny_model_dir, write_yaml, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # a private tokenization cache
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "USE_RAY", "FORCE_TORCHRUN", "NPROC_PER_NODE", "NNODES"):
        monkeypatch.delenv(name, raising=False)
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"instruction": f"What is {a} plus 2?", "input": "", "output": f"{a + 2}."} for a in range(8)]
    (data / "add.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"add": {"file_name": "add.json"}}))
    values = {
        "model_name_or_path": tiny_model_dir,
        "stage": "sft",
        "finetuning_type": "lora",
        "dataset_dir": str(data),
        "dataset": "add",
        "template": "chatml",
        "cutoff_len": 32,
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 4,
        "max_steps": 1,
        "report_to": "none",
    }
    return write_yaml(tmp_path / "train.yaml", values)


def test_a_dry_run_reads_the_config_once(config, capsys):
    from lathe.llm.commands import train_command

    assert count_opens(config, lambda: train_command(config, ["learning_rate=1e-3"], dry_run=True)) == (0, 1)
    out = capsys.readouterr().out
    assert "learning_rate: 0.001" in out and "Dry run: nothing was trained." in out


def test_a_dry_run_on_ray_plans_its_workers_from_the_same_read(config, monkeypatch, capsys):
    from lathe.llm.commands import train_command

    monkeypatch.setenv("USE_RAY", "1")  # a dry run plans ray_num_workers processes without starting Ray
    assert count_opens(config, lambda: train_command(config, ["ray_num_workers=2"], dry_run=True)) == (0, 1)
    assert "Dry run: nothing was trained." in capsys.readouterr().out


def test_a_torchrun_launch_reads_the_config_once_before_the_ranks_start(config, monkeypatch):
    import subprocess

    from lathe.llm.commands import train_command
    from lathe.llm.launch import torchrun

    commands = []

    def started(command, **kwargs):  # the ranks are commands of their own: not started here
        commands.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(torchrun.subprocess, "run", started)
    assert count_opens(config, lambda: train_command(config, ["nproc_per_node=2"])) == (0, 1)
    assert commands and "--nproc_per_node=2" in commands[0] and "nproc_per_node=2" not in commands[0]
