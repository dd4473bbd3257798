"""Launching a test worker on 2 CPU processes with torchrun (gloo), on a free port, with a timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

REPOSITORY = Path(__file__).resolve().parents[2]
WORKER = REPOSITORY / "tests" / "train" / "fsdp_worker.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(
    tmp_path: Path, name: str, options: dict, timeout: int = 240, worker: Path = WORKER, processes: int = 2
) -> subprocess.CompletedProcess:
    """torchrun `worker` (argv: output folder, result file, options as JSON) on 2 processes."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={processes}",
        f"--master_port={free_port()}",
        str(worker),
        str(tmp_path / name),
        str(tmp_path / f"{name}.json"),
        json.dumps(options),
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPOSITORY)


def torchrun(tmp_path: Path, name: str, options: dict, worker: Path = WORKER, processes: int = 2) -> dict:
    """Run `worker` (fsdp_worker.py by default) under 2 processes; rank 0's result."""
    completed = launch(tmp_path, name, options, worker=worker, processes=processes)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads((tmp_path / f"{name}.json").read_text())


def torchrun_runs(tmp_path: Path, runs: dict[str, dict], worker: Path = WORKER, processes: int = 2) -> dict:
    """Several runs of `worker` in ONE launch, one after another in the same processes, run `name` writing to
    tmp_path / name; rank 0's result per run. A launch costs each process seconds of imports on 2 cores, so the
    suite launches once per module where the runs need not be separate processes."""
    completed = launch(tmp_path, "runs", {"runs": runs, "root": str(tmp_path)}, worker=worker, processes=processes)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads((tmp_path / "runs.json").read_text())


def assert_same_weights(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    for name, weights in theirs.items():
        torch.testing.assert_close(torch.tensor(ours[name]), torch.tensor(weights), atol=1e-6, rtol=0)


def worker_main(run) -> None:
    """A worker script's entry point: run(output_dir, options) on every rank; rank 0 writes the result."""
    output_dir, result_file, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if "runs" in options:  # torchrun_runs: each run in its own folder under root, in order
        results = {name: run(str(Path(options["root"]) / name), each) for name, each in options["runs"].items()}
        if next(iter(results.values()))["rank"] == 0:
            Path(result_file).write_text(json.dumps(results))
        return
    result = run(output_dir, options)
    if result["rank"] == 0:
        Path(result_file).write_text(json.dumps(result))
