"""`lathe train` with USE_RAY=1 on Ray Train's TorchTrainer (LLaMA-Factory 0.9.4's Ray keys): the settings it
reads and its errors, then one local Ray of 2 CPUs for the whole module, on which 2 workers train as one
process with the whole batch (what torchrun on 2 processes gives: tests/train/test_distributed.py), report
their checkpoints to ray_storage_path/ray_run_name, and a stored checkpoint resumes to the same weights."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from lathe.llm.config.train import parse_train_config
from lathe.llm.config.values import RawConfig
from lathe.llm.launch.ray_settings import ray_settings

REPOSITORY = Path(__file__).resolve().parents[2]
BASE = {"model_name_or_path": "m", "dataset": "d"}
# LLaMA-Factory 0.9.4's examples/train_lora/qwen3_lora_sft_ray.yaml, Ray part
LF_RAY = {
    "ray_run_name": "qwen3_4b_sft_lora",
    "ray_storage_path": "./saves",
    "ray_num_workers": 4,
    "placement_strategy": "PACK",
    "resources_per_worker": {"GPU": 1},
}


def test_ray_keys_as_llamafactory_reads_them(tmp_path, write_yaml):
    config = write_yaml(tmp_path / "c.yaml", {**BASE, **LF_RAY, "ddp_timeout": 180000000})
    assert ray_settings(RawConfig(config, []).values) == {
        "num_workers": 4,
        "init_kwargs": {},
        "run_name": "qwen3_4b_sft_lora",
        "storage_path": "./saves",
        "storage_filesystem": None,
        "resources_per_worker": {"GPU": 1},
        "placement_strategy": "PACK",
        "max_failures": 0,
        "ddp_backend": None,
        "ddp_timeout": 180000000,
    }
    # on the command line the mappings are JSON, as LLaMA-Factory's `{`-strings
    overrides = [
        'ray_init_kwargs={"address": "auto"}',
        'resources_per_worker={"CPU": 2, "GPU": 0.5}',
        "ray_max_failures=3",
    ]
    overridden = ray_settings(RawConfig(config, overrides).values)
    assert overridden["init_kwargs"] == {"address": "auto"} and overridden["max_failures"] == 3
    assert overridden["resources_per_worker"] == {"CPU": 2, "GPU": 0.5}
    for override, message in [
        ("ray_num_workers=0", "ray_num_workers must be a whole number of at least 1"),
        ("ray_init_kwargs={num_cpus: 2", "ray_init_kwargs is not valid JSON"),
        ("placement_strategy=pack", "placement_strategy must be one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD"),
        ("ray_storage_filesystem=hdfs", "ray_storage_filesystem must be one of s3, gs, gcs"),
        ('resources_per_worker={"GPU": "one"}', r"resources_per_worker\['GPU'\] must be a number"),
        ("ray_max_failures=-2", "ray_max_failures must be a whole number of at least -1"),
        ("master_addr=10.0.0.1", "master_addr is given with USE_RAY=1: Ray Train opens the process group itself"),
        ("nproc_per_node=2", "nproc_per_node is given with USE_RAY=1: Ray Train starts ray_num_workers workers"),
    ]:
        with pytest.raises(ValueError, match=message):
            ray_settings(RawConfig(config, [override]).values)


def test_ray_keys_without_use_ray_are_a_clear_error(monkeypatch, tiny_model_dir):
    monkeypatch.delenv("USE_RAY", raising=False)
    with pytest.raises(ValueError, match="ray_num_workers, ray_storage_path are read only with USE_RAY=1"):
        parse_train_config({**BASE, "ray_num_workers": 4, "ray_storage_path": "/shared"})
    # LLaMA-Factory's defaults say nothing, so they may stay in a config trained without Ray
    defaults = {"ray_num_workers": 1, "placement_strategy": "PACK", "resources_per_worker": '{"GPU": 1}'}
    parse_train_config({"model_name_or_path": tiny_model_dir, "dataset": "d", **defaults})
    monkeypatch.setenv("USE_RAY", "1")
    config = parse_train_config({"model_name_or_path": tiny_model_dir, "dataset": "d", **LF_RAY})
    assert config.model.model_name_or_path == tiny_model_dir


def test_use_ray_refuses_force_torchrun_and_names_the_extra_when_ray_is_missing(monkeypatch):
    from lathe.llm.launch.ray_settings import import_ray
    from lathe.llm.launch.torchrun import ray_wanted

    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("USE_RAY", "1")
    monkeypatch.setenv("FORCE_TORCHRUN", "1")
    with pytest.raises(ValueError, match="USE_RAY=1 and FORCE_TORCHRUN=1 both ask to start the processes"):
        ray_wanted()
    monkeypatch.delenv("FORCE_TORCHRUN")
    assert ray_wanted()
    monkeypatch.setenv("LOCAL_RANK", "0")  # a Ray Train worker (or a torchrun rank) trains in place
    assert not ray_wanted()
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'lathe\[ray\]' \(ray\[train\]\)"):
        import_ray()


def test_a_wrong_ray_key_is_one_line_before_ray_starts(monkeypatch, capsys):
    from lathe.llm.commands import train_command

    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "FORCE_TORCHRUN", "NPROC_PER_NODE", "NNODES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("USE_RAY", "1")
    monkeypatch.chdir(REPOSITORY)
    monkeypatch.setitem(sys.modules, "ray", None)  # nothing may import Ray before the keys are checked
    assert train_command("examples/quickstart.yaml", ["ray_num_workers=2", "placement_strategy=pack"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("lathe train: error: placement_strategy must be one of PACK,") and "Traceback" not in error


def test_a_restart_resumes_from_ray_storage_but_a_new_launch_does_not(tmp_path, monkeypatch):
    """Ray hands a restarted worker the run's last stored checkpoint; on a new launch that reuses a run name
    it hands over the earlier launch's, which the driver names so the workers leave it (as LLaMA-Factory)."""
    train = pytest.importorskip("ray.train", reason="Ray Train (ray[train]) is not installed")
    from lathe.llm.launch.ray_train import last_stored_checkpoint, ray_checkpoint

    run = tmp_path / "storage/sft"
    (run / "checkpoint_2026-01-01_00-00-00.1/checkpoint").mkdir(parents=True)
    snapshot = {"latest_checkpoint_result": {"checkpoint_dir_name": "checkpoint_2026-01-01_00-00-00.1"}}
    (run / "checkpoint_manager_snapshot.json").write_text(json.dumps(snapshot))
    storage = str(tmp_path / "storage")
    assert last_stored_checkpoint(None, storage, "sft") == "checkpoint_2026-01-01_00-00-00.1"
    assert (
        last_stored_checkpoint(None, storage, "other") is None and last_stored_checkpoint(None, storage, None) is None
    )
    stored = train.Checkpoint.from_directory(str(run / "checkpoint_2026-01-01_00-00-00.1"))
    monkeypatch.setattr(train, "get_checkpoint", lambda: stored)
    with ray_checkpoint() as resume:
        assert resume == str(run / "checkpoint_2026-01-01_00-00-00.1/checkpoint")
    with ray_checkpoint(ignore="checkpoint_2026-01-01_00-00-00.1") as resume:
        assert resume is None
    monkeypatch.setattr(train, "get_checkpoint", lambda: None)
    with ray_checkpoint() as resume:
        assert resume is None


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray of 2 CPUs for the module (a start costs seconds on 2 cores)."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    pytest.importorskip("ray.train.torch", reason="Ray Train (ray[train]) is not installed")
    with pytest.MonkeyPatch.context() as patch:
        # two helper actors fewer per run (preemption watching, state reconciliation): seconds on 2 cores
        patch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        patch.setenv("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
        yield ray
        ray.shutdown()


def test_a_cluster_too_small_is_an_error_not_a_wait(local_ray):
    from lathe.llm.launch.ray_train import build_trainer

    settings = ray_settings(RawConfig(str(REPOSITORY / "examples/quickstart.yaml"), ["ray_num_workers=2"]).values)
    trainer = build_trainer(local_ray, settings, "c.yaml", [])
    assert trainer.scaling_config.resources_per_worker == {"CPU": 1}
    # Ray Train's own INFO lines (worker group, placement group) are warnings-only unless --verbose.
    assert trainer.run_config.logging_config.log_level == "WARNING"
    assert build_trainer(local_ray, settings, "c.yaml", [], verbose=True).run_config.logging_config.log_level == "INFO"
    for resources, message in [({"CPU": 2}, "needs 4 CPU, but the Ray cluster has 2"), ({"GPU": 1}, "has 0")]:
        with pytest.raises(ValueError, match=rf"resources_per_worker {next(iter(resources))}=.* {message}"):
            build_trainer(local_ray, {**settings, "resources_per_worker": resources}, "c.yaml", [])


QUICK = ["max_samples=64", "max_steps=3", "do_predict=false", "logging_steps=1", "save_strategy=steps", "save_steps=2"]


def losses(folder: Path) -> list[float]:
    entries = [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]
    return [entry["loss"] for entry in entries if "loss" in entry]


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


def assert_same_weights(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    for name, weight in theirs.items():
        torch.testing.assert_close(ours[name], weight, atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def ray_run(local_ray, tmp_path_factory):
    """`USE_RAY=1 lathe train` of the quickstart on 2 Ray Train workers (batch 4 each), checkpoints at steps 2, 3."""
    from lathe.llm.launch.ray_train import run_with_ray

    root = tmp_path_factory.mktemp("ray_train")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPOSITORY)  # the quickstart's paths are relative; the workers start from the driver's folder
        patch.setenv("USE_RAY", "1")
        overrides = [f"output_dir={root / 'out'}", *QUICK, "per_device_train_batch_size=4", "ray_num_workers=2"]
        overrides += [f"ray_storage_path={root / 'storage'}", "ray_run_name=quick"]
        assert (
            run_with_ray(RawConfig("examples/quickstart.yaml", overrides), "examples/quickstart.yaml", overrides) == 0
        )
    return root


def train_one_process(output_dir: Path, *extra: str) -> None:
    from lathe.llm.commands import train_command

    cwd = os.getcwd()
    os.chdir(REPOSITORY)
    try:
        overrides = [f"output_dir={output_dir}", *QUICK, "per_device_train_batch_size=8", *extra]
        assert train_command("examples/quickstart.yaml", overrides) == 0
    finally:
        os.chdir(cwd)


@pytest.mark.slow
def test_two_ray_train_workers_train_as_one_process_with_the_whole_batch(ray_run, tmp_path, monkeypatch):
    monkeypatch.delenv("USE_RAY", raising=False)
    train_one_process(tmp_path / "one")
    assert len(losses(ray_run / "out")) == 3
    assert losses(ray_run / "out") == pytest.approx(losses(tmp_path / "one"), abs=1e-6)
    assert_same_weights(weights(ray_run / "out/model.safetensors"), weights(tmp_path / "one/model.safetensors"))
    assert sorted(p.name for p in (ray_run / "out").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]


@pytest.mark.slow
def test_checkpoints_reach_ray_storage_and_resume_exactly(ray_run, tmp_path, monkeypatch):
    """Ray's layout (RayTrainReportCallback's, as LLaMA-Factory 0.9.4 gets it): <storage>/<run name>/
    checkpoint_<time>/checkpoint/ holds the whole lathe checkpoint, every rank's RNG state included; resuming
    from the step-2 one (what a restarted worker does) ends on the uninterrupted run's weights."""
    stored = sorted((ray_run / "storage/quick").glob("checkpoint_*/checkpoint"))
    assert [json.loads((p / "trainer_state.json").read_text())["global_step"] for p in stored] == [2, 3]
    for folder in stored:
        assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= {
            p.name for p in folder.iterdir()
        }
    assert_same_weights(weights(stored[1] / "model.safetensors"), weights(ray_run / "out/model.safetensors"))
    monkeypatch.delenv("USE_RAY", raising=False)
    train_one_process(tmp_path / "resumed", f"resume_from_checkpoint={stored[0]}")
    assert losses(tmp_path / "resumed")[-1] == pytest.approx(losses(ray_run / "out")[-1], abs=1e-6)
    assert_same_weights(weights(tmp_path / "resumed/model.safetensors"), weights(ray_run / "out/model.safetensors"))


@pytest.mark.slow
def test_stage_grpo_on_two_ray_workers_logs_trls_two_process_numbers(local_ray, tmp_path):
    """USE_RAY=1 `lathe train` of a stage grpo config on 2 Ray Train workers: each worker is one process of the
    group, so the run logs what TRL 1.16 logs on 2 processes (bench/grpo_goldens.py --processes 2), as the
    torchrun launch of the same config does (tests/llm/test_grpo_multiprocess.py)."""
    from lathe.llm.launch.ray_train import run_with_ray

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import grpo_cases
    from test_grpo_multiprocess import assert_stage_logs_trls_numbers, stage_config

    model_dir = str(tmp_path / "model")
    grpo_cases.build_model(model_dir)
    path = stage_config(tmp_path, model_dir)
    overrides = ["ray_num_workers=2", f"ray_storage_path={tmp_path / 'storage'}", "ray_run_name=grpo"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("USE_RAY", "1")
        assert run_with_ray(RawConfig(path, overrides), path, overrides) == 0
    state = json.loads((tmp_path / "stage" / "out" / "trainer_state.json").read_text())
    assert_stage_logs_trls_numbers(state["log_history"])
