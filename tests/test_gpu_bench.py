"""bench/gpu/run.py --cpu: the GPU bench's code runs end to end on the CPU with tiny shapes, so the script that a
device call runs cannot rot unseen (docs/BENCHMARKS_gpu.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_bench_runs_in_cpu_mode_and_its_checks_hold(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPOSITORY), OMP_NUM_THREADS="1")
    command = [sys.executable, str(REPOSITORY / "bench/gpu/run.py"), "--cpu", "--out", str(tmp_path)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=REPOSITORY)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = json.loads((tmp_path / "report.json").read_text())
    assert results["mode"] == "cpu" and results["ok"] is True
    assert results["environment"]["torch"] and "6 * N" in results["mfu_formula"]
    # The CUDA tests were collected and, without CUDA, reported as skipped (not missing, not failed).
    gpu_tests = results["gpu_tests"]["tests"]
    assert len(gpu_tests) >= 10 and set(gpu_tests.values()) == {"skipped"}
    runs = results["runs"]
    names = {run["name"] for run in runs}
    for method in ("full", "lora"):
        for flags in ("hf/default", "lathe/default", "lathe/chunked", "lathe/compile"):
            assert f"tiny/{method}/{flags}" in names
    for run in runs:
        assert run["ok"] is True, run
        assert run["checks"] == {"loss_falls": True, "grad_norms_nonzero": True}
        assert run["losses"][-1] < run["losses"][0]
        assert run["tokens_per_second"] > 0 and run["plan_peak_bytes"] > 0
        assert run["mfu"] is None  # no peak rate for a CPU
    # Same model, data and seed: lathe's losses equal transformers.Trainer's, with the chunked loss too.
    by_name = {run["name"]: run for run in runs}
    for method in ("full", "lora"):
        reference = by_name[f"tiny/{method}/hf/default"]["losses"]
        for flags in ("lathe/default", "lathe/chunked", "lathe/compile"):
            assert by_name[f"tiny/{method}/{flags}"]["losses"] == pytest.approx(reference, rel=1e-4)
    report = (tmp_path / "report.md").read_text()
    assert "CPU, tiny shapes" in report and "| tiny/full/lathe/chunked | 2 x 64 |" in report
    assert "## Not run" in report and "LLaMA-Factory" in report
