"""Two CPU processes (gloo, launched by torchrun) train the model one process trains with twice the
batch: equal losses and final weights; evaluation metrics equal one process's."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.train import ddp_worker
from tests.train.torchrun_helpers import REPOSITORY, torchrun_runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lathe_ranks(tmp_path_factory):
    """The 2-rank runs of this module, in one torchrun launch: lathe's, then transformers' Trainer's (when it is
    installed) in the same processes."""
    runs = {f"accumulation{steps}": {"batch": 2, "accumulation": steps} for steps in (1, 2)}
    if importlib.util.find_spec("transformers") is not None:
        runs["transformers"] = {"batch": 2, "implementation": "transformers"}
    return torchrun_runs(
        tmp_path_factory.mktemp("ranks"), runs, worker=REPOSITORY / "tests" / "train" / "ddp_worker.py"
    )


def assert_same_training(single: dict, ranks: dict) -> None:
    assert ranks["world_size"] == 2 and single["world_size"] == 1
    assert len(ranks["losses"]) == len(single["losses"])
    for ours, theirs in zip(ranks["losses"], single["losses"]):
        assert ours == pytest.approx(theirs, abs=1e-6)
    for name, weights in single["weights"].items():
        torch.testing.assert_close(torch.tensor(ranks["weights"][name]), torch.tensor(weights), atol=1e-6, rtol=0)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_two_ranks_train_like_one_with_twice_the_batch(tmp_path, lathe_ranks, accumulation):
    single = ddp_worker.run(str(tmp_path / "single"), {"batch": 4, "accumulation": accumulation})
    ranks = lathe_ranks[f"accumulation{accumulation}"]
    assert_same_training(single, ranks)
    # 13 eval items do not split evenly over 2 ranks x batch 2: the repeated samples are dropped
    assert ranks["metrics"]["eval_accuracy"] == pytest.approx(single["metrics"]["eval_accuracy"], abs=1e-12)
    assert ranks["metrics"]["eval_rows"] == single["metrics"]["eval_rows"] == 13


@pytest.mark.hf
def test_two_ranks_evaluate_as_transformers_two_ranks(lathe_ranks):
    """eval_loss under 2 ranks is transformers' (not one process's): its last step pads rank 0's short batch
    with the first samples (accelerate), each rank's loss is divided by the items of both ranks' batches and
    scaled by the world size, and the gathered repeats are trimmed to the dataset."""
    pytest.importorskip("transformers")
    ours, theirs = lathe_ranks["accumulation1"], lathe_ranks["transformers"]
    assert ours["losses"] == pytest.approx(theirs["losses"], abs=1e-6)
    for key in ("eval_loss", "eval_accuracy", "eval_rows"):
        assert ours["metrics"][key] == pytest.approx(theirs["metrics"][key], rel=1e-6), key
