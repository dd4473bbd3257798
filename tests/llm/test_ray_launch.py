"""`lathe train` with USE_RAY=1 (LLaMA-Factory's Ray keys): the settings it reads, the errors, and a real
run on a local Ray with 2 CPU workers that trains as torchrun with the same world size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lathe.llm.config.train import parse_train_config
from lathe.llm.ray_launch import ray_settings

REPOSITORY = Path(__file__).resolve().parents[2]
BASE = {"model_name_or_path": "m", "dataset": "d"}


def test_ray_keys_as_llamafactory_reads_them(tmp_path, write_yaml):
    config = write_yaml(tmp_path / "c.yaml", {**BASE, "ray_num_workers": 4, "ray_init_kwargs": {"num_cpus": 8}})
    assert ray_settings(config, []) == {
        "num_workers": 4,
        "init_kwargs": {"num_cpus": 8},
        "master_addr": None,
        "master_port": None,
    }
    # on the command line ray_init_kwargs is JSON, as LLaMA-Factory's `{`-string
    overridden = ray_settings(config, ['ray_init_kwargs={"address": "auto"}', "master_port=29600"])
    assert overridden["init_kwargs"] == {"address": "auto"} and overridden["master_port"] == 29600
    with pytest.raises(ValueError, match="ray_num_workers must be a whole number of at least 1"):
        ray_settings(config, ["ray_num_workers=0"])
    with pytest.raises(ValueError, match="ray_init_kwargs is not valid JSON"):
        ray_settings(config, ["ray_init_kwargs={num_cpus: 2"])


def test_ray_num_workers_without_use_ray_is_a_clear_error(monkeypatch, tiny_model_dir):
    monkeypatch.delenv("USE_RAY", raising=False)
    with pytest.raises(ValueError, match="ray_num_workers .*is read only with USE_RAY=1"):
        parse_train_config({**BASE, "ray_num_workers": 4})
    parse_train_config({"model_name_or_path": tiny_model_dir, "dataset": "d", "ray_num_workers": 1})  # the default
    monkeypatch.setenv("USE_RAY", "1")
    config = parse_train_config({"model_name_or_path": tiny_model_dir, "dataset": "d", "ray_num_workers": 2})
    assert config.model.model_name_or_path == tiny_model_dir


def test_use_ray_refuses_force_torchrun_and_names_the_extra_when_ray_is_missing(tmp_path, write_yaml, monkeypatch):
    from lathe.llm.launch import relaunch

    config = write_yaml(tmp_path / "c.yaml", {**BASE, "ray_num_workers": 2})
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("USE_RAY", "1")
    monkeypatch.setenv("FORCE_TORCHRUN", "1")
    with pytest.raises(ValueError, match="USE_RAY=1 and FORCE_TORCHRUN=1 both ask to start the processes"):
        relaunch(config, [])
    monkeypatch.delenv("FORCE_TORCHRUN")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'lathe\[ray\]'"):
        relaunch(config, [])


def train(output_dir: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "lathe", "train", "examples/quickstart.yaml", f"output_dir={output_dir}"]
    command += ["max_samples=64", "max_steps=3", "do_predict=false", "logging_steps=1", "per_device_train_batch_size=4"]
    command += ["save_strategy=steps", "save_steps=2", *extra]
    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY), HOME=str(output_dir.parent / "home"))
    return subprocess.run(command, cwd=REPOSITORY, env={**base, **env}, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
def test_lathe_train_on_two_ray_workers_trains_as_torchrun(tmp_path):
    """LLaMA-Factory's qwen3_lora_sft_ray keys (ray_num_workers, ray_init_kwargs) with USE_RAY=1 on a
    local Ray of 2 CPUs: the same losses, checkpoints and weights as torchrun on 2 processes."""
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from safetensors.torch import load_file

    ray_init = json.dumps({"num_cpus": 2, "include_dashboard": False})
    ray = train(tmp_path / "ray", {"USE_RAY": "1"}, "ray_num_workers=2", f"ray_init_kwargs={ray_init}")
    assert ray.returncode == 0, (ray.stdout + ray.stderr)[-3000:]
    assert "2 Ray worker(s), one CPU each" in ray.stdout
    torchrun = train(tmp_path / "torchrun", {"NPROC_PER_NODE": "2"})
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]

    def losses(folder):
        entries = [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]
        return [entry["loss"] for entry in entries if "loss" in entry]

    assert len(losses(tmp_path / "ray")) == 3
    assert losses(tmp_path / "ray") == pytest.approx(losses(tmp_path / "torchrun"), abs=1e-6)
    assert sorted(p.name for p in (tmp_path / "ray").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    ours, theirs = (load_file(tmp_path / name / "model.safetensors") for name in ("ray", "torchrun"))
    assert sorted(ours) == sorted(theirs)
    for name, weight in theirs.items():
        torch.testing.assert_close(ours[name], weight, atol=1e-6, rtol=0)
