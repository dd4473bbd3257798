"""Two nodes simulated on this machine: two torchrun launches (`--nnodes 2 --node_rank 0/1`, one
process each, gloo) meeting at 127.0.0.1. They train as one process with the whole batch, only the
job's rank 0 writes into the output_dir both share, a lost node stops the other with a clear error in
bounded time, and the job resumes from the last checkpoint (relaunched, or restarted by torchrun)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from tests.train import ddp_worker
from tests.train.torchrun_helpers import REPOSITORY, free_port

pytestmark = pytest.mark.slow

WORKER = REPOSITORY / "tests" / "train" / "multinode_worker.py"


def start_nodes(tmp_path, name: str, options: dict, rendezvous: list[str] | None = None) -> list[subprocess.Popen]:
    """One torchrun per node (static rendezvous on a free port unless `rendezvous` says otherwise)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY))
    port = free_port()
    nodes = []
    for node_rank in (0, 1):
        where = rendezvous or [f"--node_rank={node_rank}", "--master_addr=127.0.0.1", f"--master_port={port}"]
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", *where]
        command += [str(WORKER), str(tmp_path / name), str(tmp_path / f"{name}.json"), json.dumps(options)]
        log = open(tmp_path / f"{name}-node{node_rank}.log", "w")
        nodes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPOSITORY))
    return nodes


def wait(nodes: list[subprocess.Popen], timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for node in nodes:
        try:
            codes.append(node.wait(timeout=max(deadline - time.monotonic(), 1)))
        except subprocess.TimeoutExpired:
            for other in nodes:
                other.kill()
            raise
    return codes


def run_nodes(tmp_path, name: str, options: dict, **kwargs) -> dict:
    codes = wait(start_nodes(tmp_path, name, options, **kwargs))
    logs = "".join((tmp_path / f"{name}-node{rank}.log").read_text()[-3000:] for rank in (0, 1))
    assert codes == [0, 0], logs
    return json.loads((tmp_path / f"{name}.json").read_text())


def assert_same_weights(ours: dict, theirs: dict) -> None:
    for name, weights in theirs.items():
        torch.testing.assert_close(torch.tensor(ours[name]), torch.tensor(weights), atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One two-node job for the two tests below (a launch costs each process seconds of imports): batch 2 per
    node, a checkpoint every 4 steps, and a record of the files each process wrote."""
    folder = tmp_path_factory.mktemp("nodes")
    return folder, run_nodes(folder, "shared", {"batch": 2, "save_steps": 4, "record": str(folder)})


def test_two_nodes_train_like_one_process_with_the_whole_batch(tmp_path, shared):
    single = ddp_worker.run(str(tmp_path / "single"), {"batch": 4, "save_steps": 4})
    nodes = shared[1]
    assert nodes["world_size"] == 2
    assert nodes["losses"] == pytest.approx(single["losses"], abs=1e-6)
    assert_same_weights(nodes["weights"], single["weights"])


def test_one_writer_in_a_shared_output_dir(shared):
    """save_on_each_node=False (the default): only the job's rank 0 writes, never node 1's local rank 0."""
    folder, _ = shared
    written = [set(json.loads((folder / f"writes-{rank}.json").read_text())) for rank in (0, 1)]
    steps = (4, 8, 12, 16)  # 2 epochs of 8 steps
    assert {f"checkpoint-{step}" for step in steps} <= written[0]
    checkpoint = {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state_0.pth"}
    assert checkpoint <= {os.path.basename(path) for path in written[0]}, written[0]
    # node 1 writes only its own RNG state, under its global rank's name, into rank 0's staging folder
    assert {os.path.basename(path) for path in written[1]} == {"rng_state_1.pth"}, written[1]
    assert sorted(os.listdir(folder / "shared")) == sorted(f"checkpoint-{step}" for step in steps)


def test_save_on_each_node_on_a_shared_output_dir_is_a_clear_error(tmp_path):
    """True makes every node's local rank 0 save (transformers' meaning, for nodes with a disk each):
    on one folder both nodes share, every process stops before training and says why."""
    nodes = start_nodes(tmp_path, "shared", {"batch": 2, "epochs": 1, "save_steps": 4, "save_on_each_node": True})
    assert wait(nodes) == [1, 1]
    for rank in (0, 1):
        assert (
            "save_on_each_node=True, but the 2 nodes share output_dir"
            in (tmp_path / f"shared-node{rank}.log").read_text()
        )
    assert os.listdir(tmp_path / "shared") == []  # the marker is gone, nothing was trained or saved


def test_a_lost_node_stops_the_job_with_a_clear_error_then_a_relaunch_resumes(tmp_path):
    options = {"batch": 2, "save_steps": 4, "crash_rank": 1, "crash_step": 6, "ddp_timeout": 30, "resume": True}
    started = time.monotonic()
    codes = wait(start_nodes(tmp_path, "job", options), timeout=90)
    assert codes[0] != 0 and codes[1] != 0 and time.monotonic() - started < 90
    survivor = (tmp_path / "job-node0.log").read_text()
    assert "Process 0 of 2 lost contact with the other processes after step" in survivor
    assert "checkpoint-4, is intact: resume from it" in survivor
    assert sorted(os.listdir(tmp_path / "job")) == ["checkpoint-4"]
    # the same command again: both nodes resume from checkpoint-4 and end as an uninterrupted run
    resumed = run_nodes(tmp_path, "job", dict(options, crash_step=None))
    assert resumed["resumed_from"].endswith("checkpoint-4")
    uninterrupted = ddp_worker.run(str(tmp_path / "single"), {"batch": 4})  # as two nodes (the first test)
    assert resumed["losses"] == pytest.approx(uninterrupted["losses"], abs=1e-6)  # steps 1-4 from the checkpoint
    assert_same_weights(resumed["weights"], uninterrupted["weights"])
