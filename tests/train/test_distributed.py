"""Two CPU processes (gloo, launched by torchrun) train the model one process trains with twice the
batch: equal losses and final weights; evaluation metrics equal one process's."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train import ddp_worker

pytestmark = pytest.mark.slow
REPOSITORY = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(tmp_path: Path, options: dict, processes: int = 2) -> dict:
    result_file = tmp_path / "result.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY))
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={free_port()}",
               str(REPOSITORY / "tests" / "train" / "ddp_worker.py"), str(tmp_path / "out"), str(result_file), json.dumps(options)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=REPOSITORY)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(result_file.read_text())


def assert_same_training(single: dict, ranks: dict) -> None:
    assert ranks["world_size"] == 2 and single["world_size"] == 1
    assert len(ranks["losses"]) == len(single["losses"])
    for ours, theirs in zip(ranks["losses"], single["losses"]):
        assert ours == pytest.approx(theirs, abs=1e-6)
    for name, weights in single["weights"].items():
        torch.testing.assert_close(torch.tensor(ranks["weights"][name]), torch.tensor(weights), atol=1e-6, rtol=0)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_two_ranks_train_like_one_with_twice_the_batch(tmp_path, accumulation):
    single = ddp_worker.run(str(tmp_path / "single"), {"batch": 4, "accumulation": accumulation})
    ranks = torchrun(tmp_path, {"batch": 2, "accumulation": accumulation})
    assert_same_training(single, ranks)
    # 13 eval items do not split evenly over 2 ranks x batch 2: the repeated samples are dropped
    assert ranks["metrics"]["eval_loss"] == pytest.approx(single["metrics"]["eval_loss"], abs=1e-6)
    assert ranks["metrics"]["eval_accuracy"] == pytest.approx(single["metrics"]["eval_accuracy"], abs=1e-12)
    assert ranks["metrics"]["eval_rows"] == single["metrics"]["eval_rows"] == 13
