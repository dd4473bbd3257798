"""report_to="wandb" / "mlflow" / "trackio": a run offline, and what each tracker stored, read back from its
own files (transformers' metric names: train/loss, eval/x; the arguments as config or parameters)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # one training run in a fresh process, with three trackers: ~15 s
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    for name in ("wandb", "mlflow", "trackio"):
        pytest.importorskip(name)
    folder = tmp_path_factory.mktemp("reporters")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        WANDB_DIR=str(folder),
        WANDB_SILENT="true",
        MLFLOW_TRACKING_URI=(folder / "mlruns").as_uri(),
        MLFLOW_ALLOW_FILE_STORE="true",  # mlflow 3 keeps its local file store behind this switch
        TRACKIO_DIR=str(folder / "trackio"),
        HF_HUB_OFFLINE="1",
    )
    env.pop("WANDB_MODE", None)  # lathe's default: offline
    env.pop("PYTEST_CURRENT_TEST", None)  # wandb changes what it records when it sees it runs under pytest
    done = subprocess.run(
        [sys.executable, "-m", "tests.train.reporters_worker", str(folder)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def step_losses(log_history):
    return [(entry["step"], entry["loss"]) for entry in log_history if "loss" in entry]


def test_wandb_offline_run_holds_every_log(logged):
    wandb = logged["wandb"]
    assert wandb["name"] == "tiny" and wandb["learning_rate"] == 0.1  # the arguments are the run's config
    logged_losses = [(row["train/global_step"], row["train/loss"]) for row in wandb["history"] if "train/loss" in row]
    assert logged_losses == step_losses(logged["log_history"])
    final = logged["log_history"][-1]
    assert wandb["summary"]["train_loss"] == pytest.approx(final["train_loss"])  # end numbers: run summary
    assert all("train/train_loss" not in row for row in wandb["history"])


def test_mlflow_run_holds_parameters_and_metrics(logged):
    mlflow = logged["mlflow"]
    assert mlflow["name"] == "tiny" and mlflow["status"] == "FINISHED"  # the callback ended the run it started
    assert mlflow["params"]["learning_rate"] == "0.1" and mlflow["params"]["max_steps"] == "4"
    assert [tuple(point) for point in mlflow["metrics"]["loss"]] == step_losses(logged["log_history"])
    final = logged["log_history"][-1]
    assert mlflow["metrics"]["train_loss"] == [[4, pytest.approx(final["train_loss"])]]


def test_trackio_local_run_holds_every_log(logged):
    trackio = logged["trackio"]
    assert trackio["run"] == "tiny"
    rows = [(row["train/global_step"], row["train/loss"]) for row in trackio["logs"] if "train/loss" in row]
    assert rows == step_losses(logged["log_history"])
    assert all("train/train_runtime" not in row for row in trackio["logs"])  # end numbers are not steps
