"""report_to="kubeflow": training progress (percent, time left, latest metrics) POSTed to the Kubeflow Trainer
controller, as transformers' KubeflowCallback sends it. Standard library only; added to report_to when
KUBEFLOW_TRAINER_SERVER_URL is set (unless DISABLE_KUBEFLOW_INTEGRATION=TRUE), as in transformers."""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.request
from datetime import datetime, timezone

from lathe.train.callbacks.events import TrainerCallback

logger = logging.getLogger(__name__)


def kubeflow_requested() -> bool:
    if os.getenv("DISABLE_KUBEFLOW_INTEGRATION", "FALSE").upper() == "TRUE":
        return False
    return os.getenv("KUBEFLOW_TRAINER_SERVER_URL") is not None


class KubeflowCallback(TrainerCallback):
    """The main process reports at the start, at most every 5 s after a step, and at the end (100%).
    KUBEFLOW_TRAINER_SERVER_TOKEN names the file of the bearer token (re-read every 5 minutes),
    KUBEFLOW_TRAINER_SERVER_CA_CERT the CA certificate. A failed report never stops training."""

    min_interval_s = 5.0
    token_lifetime_s = 300.0

    def __init__(self):
        if not kubeflow_requested():
            raise RuntimeError(
                "report_to='kubeflow' needs KUBEFLOW_TRAINER_SERVER_URL (set inside a Kubeflow TrainJob)."
            )
        self._metrics, self._start, self._last_sent = {}, None, 0.0
        self._token, self._token_time = None, 0.0

    def _read_token(self):
        now = time.monotonic()
        if self._token and now - self._token_time < self.token_lifetime_s:
            return self._token
        path = os.environ.get("KUBEFLOW_TRAINER_SERVER_TOKEN")
        try:
            with open(path, encoding="utf-8") as handle:
                self._token, self._token_time = handle.read().strip(), now
        except (OSError, TypeError):
            logger.debug("Kubeflow: no token file at %s", path)
            return None
        return self._token

    def _send(self, percent=None, seconds_left=None, metrics=None, force=False) -> bool:
        now = time.monotonic()
        if not force and now - self._last_sent < self.min_interval_s:
            return False
        self._last_sent = now
        token = self._read_token()
        if not token:
            return False
        status = {"lastUpdatedTime": datetime.now(timezone.utc).isoformat()}
        if percent is not None:
            status["progressPercentage"] = max(0, min(100, percent))
        if seconds_left is not None:
            status["estimatedRemainingSeconds"] = max(0, int(seconds_left))
        if metrics:
            status["metrics"] = [{"name": str(key), "value": str(value)} for key, value in metrics.items()]
        request = urllib.request.Request(
            os.environ["KUBEFLOW_TRAINER_SERVER_URL"],
            data=json.dumps({"trainerStatus": status}).encode("utf-8"),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="POST",
        )
        ca_file = os.environ.get("KUBEFLOW_TRAINER_SERVER_CA_CERT")
        try:
            context = ssl.create_default_context(cafile=ca_file) if ca_file else None
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                return response.status == 200
        except Exception as error:  # the controller being away must not stop training
            logger.debug("Kubeflow: status update failed: %s", error)
            return False

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._start, self._metrics = time.time(), {}
            self._send(0, metrics={"total_steps": state.max_steps} if state.max_steps else None, force=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._start is not None and state.is_world_process_zero and logs:
            self._metrics.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})

    def on_step_end(self, args, state, control, **kwargs):
        if self._start is None or not state.is_world_process_zero or not state.max_steps or state.max_steps <= 0:
            return
        seconds_left = None
        if state.global_step > 0:
            seconds_left = (time.time() - self._start) / state.global_step * (state.max_steps - state.global_step)
        metrics = {**self._metrics, "current_step": state.global_step, "total_steps": state.max_steps}
        if state.epoch is not None:
            metrics["current_epoch"] = round(state.epoch, 2)
        # 99% at most until the end of training says 100%
        self._send(min(int(state.global_step / state.max_steps * 100), 99), seconds_left, metrics)

    def on_train_end(self, args, state, control, **kwargs):
        if self._start is not None and state.is_world_process_zero:
            self._send(100, 0, self._metrics, force=True)
