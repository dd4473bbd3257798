"""A preference stage on 2 processes through `lathe train`: the same numbers as one process with the
whole batch, which the golden file holds (LLaMA-Factory's single-process logs). DPO under FSDP2 with
full fine-tuning: the frozen reference copy is sharded like the policy, the metrics are averaged over
the ranks. (One 2-process run keeps the suite fast; KTO under DDP, whose KL estimate is averaged over
the ranks, was seen to equal one process too: docs/PREFERENCE.md.)

Tolerance 1e-5 relative, or 1e-5 absolute: the ranks' gradients and metrics are summed by all-reduce in
another order than one process sums its batch (float32 rounding, compounded over a few Adam steps; seen up
to 1e-7 relative). Rewards are beta x differences of two log-probs near -40, whose rounding (~1e-6) is
not small relative to the difference itself: seen up to 5e-7 absolute.
logits/* are not compared: they average the logits over every position, padding included, and each
rank pads its own half of the batch (as in LLaMA-Factory)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.goldens import assert_close_to_golden
from tests.llm.golden.make_llamafactory_preference import CASES, GOLDEN, build_model, case_config

REPOSITORY = Path(__file__).resolve().parents[2]
NOT_COMPARED = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos")


def _two_processes(tmp_path, name: str, **changes) -> list[dict]:
    import yaml

    build_model(tmp_path / "model", seed=0)
    config = {**case_config(CASES[name], str(tmp_path / "model"), ""), **changes, "output_dir": str(tmp_path / "out")}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    env = dict(
        os.environ, NPROC_PER_NODE="2", OMP_NUM_THREADS="1", HOME=str(tmp_path / "home"), PYTHONPATH=str(REPOSITORY)
    )
    result = subprocess.run(
        [sys.executable, "-m", "lathe", "train", str(path)],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]


def _assert_close(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs)
    for mine, peer in zip(ours, theirs):
        keys = {key for key in peer if key not in NOT_COMPARED}
        assert {key for key in mine if key not in NOT_COMPARED} == keys
        keys -= {"logits/chosen", "logits/rejected"}
        # two processes sum in another order than the golden's one: wider than the golden tolerance
        step = f"fsdp2 dpo logs, step {peer['step']}"
        assert_close_to_golden({k: mine[k] for k in keys}, {k: peer[k] for k in keys}, step, rel=1e-5, abs=1e-5)


@pytest.mark.slow
def test_dpo_full_fine_tuning_under_fsdp2_equals_one_process(tmp_path):
    with open(GOLDEN, encoding="utf-8") as handle:
        golden = json.load(handle)["runs"]["dpo_sigmoid_full_smoothing_ftx"]
    ours = _two_processes(
        tmp_path, "dpo_sigmoid_full_smoothing_ftx", per_device_train_batch_size=1, fsdp="full_shard auto_wrap"
    )
    _assert_close(ours, golden)
