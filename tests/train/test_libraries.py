"""Libraries built on transformers' Trainer, on lathe's (issue 38): TRL's SFTTrainer (conversational data,
packing, assistant-only loss, step evaluation and checkpoints) run with lathe.patch_transformers(), compared
with what it gives on transformers' Trainer: log history, metrics, every checkpoint's files (JSON contents,
each tensor's sums) and the final model, floats within rtol 1e-5.

The golden file is written by the generator we ship, run beside the peers (bench/.cache/peers-venv: torch
2.13.0, transformers 5.23.0, accelerate 1.15.0, trl 1.16.0), outside the repository:
    PYTHONHASHSEED=0 python bench/library_jobs.py sft tests/train/golden/libraries/sft.json
bench/library_jobs.py runs the other libraries the same way (sentence-transformers, TRL's DPO and reward
trainers, setfit), compared by bench/library_compare.py; docs/COMPATIBILITY.md lists what was measured."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.train.torchrun_helpers import REPOSITORY

GOLDEN = REPOSITORY / "tests" / "train" / "golden" / "libraries"


@pytest.mark.slow
@pytest.mark.parametrize("job", ["sft"])
def test_trl_trainer_on_lathe_gives_transformers_results(tmp_path, job):
    pytest.importorskip("trl")
    out = tmp_path / f"{job}.json"
    env = dict(os.environ, PYTHONPATH=str(REPOSITORY), PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    jobs = [sys.executable, str(REPOSITORY / "bench" / "library_jobs.py"), job, str(out), "--lathe"]
    done = subprocess.run(jobs, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    compare = [sys.executable, str(REPOSITORY / "bench" / "library_compare.py"), str(GOLDEN / f"{job}.json"), str(out)]
    compared = subprocess.run(compare, capture_output=True, text=True, timeout=120)
    assert compared.returncode == 0, compared.stdout[-4000:]
    assert compared.stdout.strip().endswith("0 differences")
