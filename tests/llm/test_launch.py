"""`lathe train` on several processes: when it relaunches itself under torchrun, with which settings
(config keys and LLaMA-Factory's environment variables), and a real 2-process run of the quickstart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lathe.llm.config.train import parse_train_config
from lathe.llm.config.values import RawConfig
from lathe.llm.launch.torchrun import launch_settings, torchrun_command, without_launch_keys

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(tmp_path, write_yaml):
    return write_yaml(tmp_path / "c.yaml", {"model_name_or_path": "m", "dataset": "d"})


@pytest.fixture(autouse=True)
def not_under_torchrun(monkeypatch):
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


def test_one_process_unless_asked(config):
    assert launch_settings(RawConfig(config, []).values, environ={}, cuda_devices=0) is None
    assert launch_settings(RawConfig(config, []).values, environ={}, cuda_devices=1) is None


def test_several_processes_from_the_config_the_command_line_or_the_environment(config, tmp_path, write_yaml):
    settings = launch_settings(RawConfig(config, ["nproc_per_node=2"]).values, environ={}, cuda_devices=0)
    assert settings["nproc_per_node"] == 2 and settings["nnodes"] == 1 and settings["master_addr"] == "127.0.0.1"
    assert 0 < settings["master_port"] < 65536
    assert (
        launch_settings(RawConfig(config, []).values, environ={"NPROC_PER_NODE": "3"}, cuda_devices=0)["nproc_per_node"]
        == 3
    )
    in_file = write_yaml(tmp_path / "d.yaml", {"model_name_or_path": "m", "nproc_per_node": 4})
    assert (
        launch_settings(RawConfig(in_file, []).values, environ={"NPROC_PER_NODE": "3"}, cuda_devices=0)[
            "nproc_per_node"
        ]
        == 4
    )
    assert (
        launch_settings(RawConfig(config, []).values, environ={}, cuda_devices=2)["nproc_per_node"] == 2
    )  # every GPU, as LLaMA-Factory
    forced = launch_settings(
        RawConfig(config, []).values, environ={"FORCE_TORCHRUN": "1", "MASTER_PORT": "29511"}, cuda_devices=0
    )
    assert forced["nproc_per_node"] == 1 and forced["master_port"] == 29511


def test_multi_node_settings_and_errors(config):
    environ = {
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "NPROC_PER_NODE": "8",
    }
    assert launch_settings(RawConfig(config, []).values, environ=environ, cuda_devices=0) == {
        "nproc_per_node": 8,
        "nnodes": 2,
        "node_rank": 1,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
    }
    with pytest.raises(ValueError, match="MASTER_ADDR and MASTER_PORT"):
        launch_settings(RawConfig(config, []).values, environ={"NNODES": "2"}, cuda_devices=0)
    with pytest.raises(ValueError, match="nproc_per_node .*whole number"):
        launch_settings(RawConfig(config, ["nproc_per_node=two"]).values, environ={}, cuda_devices=0)


def test_never_relaunches_inside_torchrun(config, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert (
        launch_settings(RawConfig(config, ["nproc_per_node=2"]).values, environ={"FORCE_TORCHRUN": "1"}, cuda_devices=0)
        is None
    )


def test_the_ranks_get_the_config_without_the_launch_keys(config):
    overrides = ["nproc_per_node=2", "--nnodes", "1", "learning_rate=1e-3", "--master-port=29500", "--seed", "3"]
    assert without_launch_keys(overrides) == ["learning_rate=1e-3", "--seed", "3"]
    command = torchrun_command(
        {"nproc_per_node": 2, "nnodes": 1, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29500},
        config,
        overrides,
    )
    assert command[1:3] == ["-m", "torch.distributed.run"] and "--nproc_per_node=2" in command
    assert command[-6:] == ["lathe", "train", config, "learning_rate=1e-3", "--seed", "3"]


def test_launch_keys_are_accepted_by_the_config_parser(tiny_model_dir):
    config = parse_train_config(
        {
            "model_name_or_path": tiny_model_dir,
            "dataset": "d",
            "nproc_per_node": 2,
            "master_port": 29500,
            "output_dir": "x",
        }
    )
    assert config.training.output_dir == "x"


def launch_quickstart(output_dir, *overrides, home=None):
    """`lathe train examples/quickstart.yaml` on 2 CPU processes (one thread each); the finished process."""
    env = dict(os.environ, NPROC_PER_NODE="2", OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY))
    if home is not None:
        env["HOME"] = str(home)
    command = [sys.executable, "-m", "lathe", "train", "examples/quickstart.yaml", f"output_dir={output_dir}"]
    result = subprocess.run(
        [*command, *overrides], cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# 12 steps on 64 examples, then greedy answers to 64 prompts: trained enough that the answers' lengths differ, so
# the ranks finish generating at different steps (with sharded weights a rank that stops early would hang the other).
GENERATING = ("max_samples=64", "max_steps=12", "per_device_train_batch_size=8", "per_device_eval_batch_size=16")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same short quickstart run under DDP, DeepSpeed ZeRO-3 and FSDP2, each on 2 processes, lazily."""
    folder, done = tmp_path_factory.mktemp("runs"), {}
    sharding = {
        "ddp": ("logging_steps=1",),
        # ZeRO-3 also saves a checkpoint: its partitions and the whole weights gathered from them
        "zero3": ("deepspeed=examples/deepspeed/ds_z3_config.json", "save_strategy=steps", "save_steps=12"),
        "fsdp": ("fsdp=full_shard auto_wrap",),
    }

    def run(name):
        if name not in done:
            home = folder / "home"  # fresh for the first run: rank 0 tokenizes, rank 1 reads its cache
            done[name] = launch_quickstart(folder / name, *GENERATING, *sharding[name], home=home), folder / name
        return done[name]

    return run


def predictions(output_dir):
    lines = (output_dir / "generated_predictions.jsonl").read_text().splitlines()
    return [json.loads(line)["predict"] for line in lines]


@pytest.mark.slow
def test_lathe_train_on_two_processes(runs):
    """The quickstart config on 2 CPU processes: rank 0 preprocesses, both train, one model is saved."""
    result, output_dir = runs("ddp")
    assert "2 process(es) per node" in result.stdout
    assert result.stdout.count("Plan: stage sft") == 1  # printed by rank 0 only
    assert "16 examples per step = 8 per device x 1 accumulation x 2 process(es)" in result.stdout
    # rank 0 tokenizes (fresh HOME: no cache), rank 1 waits and loads rank 0's cache
    assert result.stderr.count("Tokenized dataset loaded from the cache") == 1
    assert (output_dir / "model.safetensors").is_file()
    results = json.loads((output_dir / "train_results.json").read_text())
    log = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    assert results["epoch"] > 0 and [entry["current_steps"] for entry in log if "loss" in entry] == list(range(1, 13))


@pytest.mark.slow
def test_lathe_train_with_deepspeed_zero3_on_two_processes(runs):
    """LLaMA-Factory's way to shard: `deepspeed: <ds_z3_config.json>` with "auto" values, on 2 processes."""
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    from transformers import AutoModelForCausalLM

    result, output_dir = runs("zero3")
    assert "sharding        DeepSpeed ZeRO stage 3 (examples/deepspeed/ds_z3_config.json)" in result.stdout
    checkpoint = output_dir / "checkpoint-12"
    assert (checkpoint / "latest").read_text().strip() == "global_step12"
    assert len(list((checkpoint / "global_step12").glob("*optim_states.pt"))) == 2  # one partition per rank
    # the weights gathered from the ZeRO-3 partitions are the whole model, loadable by transformers
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    reference = AutoModelForCausalLM.from_pretrained(checkpoint)
    for (name, weight), (_, saved) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert weight.shape == saved.shape and torch.equal(weight, saved), name


@pytest.mark.slow
def test_lora_under_deepspeed_zero2_resumes_exactly(tmp_path):
    """The common LLaMA-Factory recipe, LoRA + ZeRO-2 on 2 processes: the checkpoint holds only the
    adapter's state, and resuming it gives the uninterrupted run's adapter, bit for bit."""
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    from safetensors.torch import load_file

    def train(output_dir, *extra):
        lora = ("finetuning_type=lora", "lora_target=all", "deepspeed=examples/deepspeed/ds_z2_config.json")
        steps = ("max_samples=256", "max_steps=4", "save_strategy=steps", "save_steps=2", "do_predict=false")
        launch_quickstart(output_dir, *steps, *lora, *extra)

    train(tmp_path / "whole")
    checkpoint = tmp_path / "whole" / "checkpoint-2"
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()
    model_states = checkpoint / "global_step2" / "mp_rank_00_model_states.pt"
    assert model_states.stat().st_size < 0.2 * 585_216 * 4  # the frozen base (585k parameters) is not in it
    train(tmp_path / "resumed", f"resume_from_checkpoint={checkpoint}")
    whole, resumed = (
        load_file(tmp_path / "whole" / "adapter_model.safetensors"),
        load_file(tmp_path / "resumed" / "adapter_model.safetensors"),
    )
    assert sorted(whole) == sorted(resumed) and len(whole) > 0
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name


@pytest.mark.slow
def test_generation_with_sharded_weights_on_two_processes(runs):
    """do_predict with generation when the weights are sharded (ZeRO-3, FSDP2): ranks whose answers end
    at different lengths neither hang nor fail, and the answers equal DDP's (whole weights per rank)."""
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    ddp = predictions(runs("ddp")[1])
    assert len(ddp) == 64 and len({len(answer) for answer in ddp}) > 3  # the ranks finish at different steps
    assert predictions(runs("zero3")[1]) == ddp
    assert predictions(runs("fsdp")[1]) == ddp
