"""report_to="kubeflow": added inside a Kubeflow TrainJob as transformers adds it, and the progress it POSTs,
received by a controller stand-in on the loopback interface."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from lathe import Trainer, TrainingArguments
from tests.train.trainer_helpers import Regression, regression_items, training_args


@pytest.fixture
def controller(monkeypatch, tmp_path):
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.headers["Authorization"], json.loads(body)["trainerStatus"]))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    token = tmp_path / "token"
    token.write_text("secret\n")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", f"http://127.0.0.1:{server.server_port}/status")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    yield received
    server.shutdown()


def test_kubeflow_is_added_inside_a_trainjob(controller, monkeypatch):
    assert TrainingArguments(output_dir="o").report_to == ["kubeflow"]
    assert TrainingArguments(output_dir="o", report_to="jsonl").report_to == ["jsonl", "kubeflow"]
    assert TrainingArguments(output_dir="o", report_to=["kubeflow", "jsonl"]).report_to == ["kubeflow", "jsonl"]
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "true")
    assert TrainingArguments(output_dir="o").report_to == []


def test_kubeflow_reports_progress_and_metrics(controller, tmp_path):
    args = training_args(tmp_path, max_steps=3, report_to="kubeflow")
    Trainer(model=Regression(), args=args, train_dataset=regression_items(12)).train()
    assert {auth for auth, _ in controller} == {"Bearer secret"}
    first, last = controller[0][1], controller[-1][1]
    assert first["progressPercentage"] == 0 and first["metrics"] == [{"name": "total_steps", "value": "3"}]
    assert last["progressPercentage"] == 100 and last["estimatedRemainingSeconds"] == 0
    assert {"loss", "train_loss"} <= {metric["name"] for metric in last["metrics"]}
    # within 5 s of the start report, step reports wait: only the start and the end went out
    assert len(controller) == 2


def test_kubeflow_without_the_controller_still_trains(controller, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://127.0.0.1:9/unreachable")
    args = training_args(tmp_path, max_steps=2, report_to="kubeflow")
    trainer = Trainer(model=Regression(), args=args, train_dataset=regression_items(12))
    assert trainer.train().global_step == 2
