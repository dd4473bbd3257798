"""examples/extend_trainer.py runs as users run it, and does what it says: its callback stops training at
the first logged loss at or below the target, and its compute_loss override is the loss that is trained
and evaluated."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "extend_trainer.py"


def load_example():
    spec = importlib.util.spec_from_file_location("extend_trainer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    example = load_example()
    return example, example.main(str(tmp_path_factory.mktemp("extend")), target=0.05, max_steps=2000)


def test_the_callback_stops_training_at_the_first_log_at_or_below_the_target(run):
    _, outcome = run
    stopper, result = outcome["stopper"], outcome["result"]
    steps, losses = zip(*stopper.logged)
    assert 1 < len(steps) and result.global_step < 2000
    assert stopper.stopped_at == steps[-1] == result.global_step  # the run ended after the step that logged it
    assert losses[-1] <= 0.05 < min(losses[:-1])


def test_the_compute_loss_override_is_the_evaluated_loss(run):
    example, outcome = run
    model = outcome["trainer"].model.eval()
    rows = example.make_data(512, seed=1)
    x, y = torch.stack([row["x"] for row in rows]), torch.stack([row["labels"] for row in rows])
    with torch.no_grad():
        expected = F.huber_loss(model(x), y, delta=0.5).item()
    assert outcome["eval"]["eval_loss"] == pytest.approx(expected, rel=1e-5)
    # The model computes no loss: without the override, training would have nothing to minimise.
    assert torch.is_tensor(model(x[:2])) and model(x[:2]).shape == (2,)


def test_the_example_runs_as_a_script(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped at step" in done.stdout and "held-out Huber loss" in done.stdout
