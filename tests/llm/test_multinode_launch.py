"""`lathe train` on two nodes simulated on this machine: each node runs the same command with
LLaMA-Factory's NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT (one process each), and the job trains
as one process with the whole batch; the plan, printed once, counts 2 processes (and a dry run's, made
before launch, every node's processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train.torchrun_helpers import free_port

REPOSITORY = Path(__file__).resolve().parents[2]


def test_a_dry_run_plans_per_process_for_every_node(monkeypatch, capsys):
    """Before launch, the plan counts NNODES x NPROC_PER_NODE processes (the batch, FSDP2's shares)."""
    from lathe.llm.commands import train_command

    monkeypatch.chdir(REPOSITORY)
    for name, value in {
        "NNODES": "2",
        "NPROC_PER_NODE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "USE_RAY"):
        monkeypatch.delenv(name, raising=False)
    code = train_command("examples/quickstart.yaml", ["max_samples=64", "fsdp=full_shard"], dry_run=True)
    output = capsys.readouterr().out
    assert code == 0, output
    assert "256 examples per step = 64 per device x 1 accumulation x 4 process(es)" in output
    assert "FSDP2 over 4 processes: weights, gradients, optimizer state 1/4 per process" in output
    monkeypatch.setenv("USE_RAY", "1")
    assert train_command("examples/quickstart.yaml", ["max_samples=64", "ray_num_workers=3"], dry_run=True) == 0
    assert "x 1 accumulation x 3 process(es)" in capsys.readouterr().out


def command(output_dir: Path, batch: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lathe",
        "train",
        "examples/quickstart.yaml",
        f"output_dir={output_dir}",
        "max_samples=64",
        "max_steps=3",
        "do_predict=false",
        "logging_steps=1",
        f"per_device_train_batch_size={batch}",
    ]


def losses(folder: Path) -> list[float]:
    entries = [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]
    return [entry["loss"] for entry in entries if "loss" in entry]


@pytest.mark.slow
def test_lathe_train_on_two_nodes_trains_as_one_process_with_the_whole_batch(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from lathe.llm.commands import train_command

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY), HOME=str(tmp_path / "home"))
    for name in ("NPROC_PER_NODE", "FORCE_TORCHRUN", "USE_RAY", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
        monkeypatch.delenv(name, raising=False)
    # the one-process reference in this process (a new Python costs ~10 CPU s of imports); the nodes are commands
    monkeypatch.setenv("HOME", env["HOME"])
    monkeypatch.chdir(REPOSITORY)
    config, *overrides = command(tmp_path / "single", 8)[4:]  # after `python -m lathe train`
    assert train_command(config, overrides) == 0
    port = str(free_port())
    nodes = [
        subprocess.Popen(
            command(tmp_path / "nodes", 4),
            cwd=REPOSITORY,
            env=dict(env, NNODES="2", NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    assert "1 process(es) per node x 2 node(s), rendezvous at 127.0.0.1:" in outputs[1][0]
    # the plan is printed by the job's rank 0 only, and counts the processes of both nodes
    assert "8 examples per step = 4 per device x 1 accumulation x 2 process(es)" in outputs[0][0]
    assert "Plan: stage sft" not in outputs[1][0]
    assert losses(tmp_path / "nodes") == pytest.approx(losses(tmp_path / "single"), abs=1e-5)
    ours, theirs = (load_file(tmp_path / name / "model.safetensors") for name in ("nodes", "single"))
    for name, weight in theirs.items():
        torch.testing.assert_close(ours[name], weight, atol=1e-5, rtol=0)
    assert not (tmp_path / "nodes" / "checkpoint-3").exists()  # save_strategy "no" in the quickstart
