"""Runs under the web page's root: every output_dir with a trainer_log.jsonl or trainer_state.json (runs
started from the command line too), their status, and the points of their charts."""

from __future__ import annotations

import glob
import json
import os

from lathe.llm.webui.paths import relative

TRAINER_LOG = "trainer_log.jsonl"  # written by lathe train (lathe/llm/workflows/outputs.py)
TRAINER_STATE = "trainer_state.json"
JOB_LOG = "webui_job.log"  # stdout and stderr of a run the page started (jobs.py)
MAX_DEPTH = 4  # how deep under the root runs are looked for
MAX_LOG_LINES = 20000  # a longer trainer_log.jsonl is read from its last lines
TAIL_BYTES = 16384


def find_runs(root: str) -> list[str]:
    """Output folders under root (relative, sorted), not descending into checkpoints or hidden folders."""
    found = []
    root = os.path.realpath(root)
    base_depth = root.rstrip(os.sep).count(os.sep)
    for folder, subfolders, files in os.walk(root, followlinks=False):
        depth = folder.rstrip(os.sep).count(os.sep) - base_depth
        subfolders[:] = [name for name in subfolders if not name.startswith((".", "checkpoint-")) and depth < MAX_DEPTH]
        if TRAINER_LOG in files or TRAINER_STATE in files or JOB_LOG in files:
            found.append(relative(root, folder))
    return sorted(found)


def read_points(output_dir: str) -> list[dict]:
    """The run's log events: trainer_log.jsonl's lines (loss, eval_loss, lr, throughput, times), with
    grad_norm and GRPO's reward added from the newest trainer_state.json (the log line does not carry them); a run without a
    trainer_log.jsonl (not lathe's) gives its trainer_state.json's log_history instead."""
    path = os.path.join(output_dir, TRAINER_LOG)
    state_history = _state_history(output_dir)
    if not os.path.isfile(path):
        return [_from_history(entry) for entry in state_history]
    points = []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()[-MAX_LOG_LINES:]
    for line in lines:
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written right now
    for key in ("grad_norm", "reward"):  # GRPO logs its mean reward per step in the state, not the log line
        values = {entry.get("step"): entry[key] for entry in state_history if key in entry}
        for point in points:
            if point.get("current_steps") in values and point.get("loss") is not None:
                point[key] = values[point["current_steps"]]
    return points


def _state_history(output_dir: str) -> list[dict]:
    """log_history of the newest trainer_state.json: the output_dir's, else the last checkpoint's."""
    candidates = [os.path.join(output_dir, TRAINER_STATE)] + glob.glob(
        os.path.join(output_dir, "checkpoint-*", TRAINER_STATE)
    )
    candidates = [path for path in candidates if os.path.isfile(path)]
    if not candidates:
        return []
    try:
        with open(max(candidates, key=os.path.getmtime), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, json.JSONDecodeError):
        return []
    return [entry for entry in state.get("log_history", []) if isinstance(entry, dict)]


def _from_history(entry: dict) -> dict:
    point = {"current_steps": entry.get("step"), "epoch": entry.get("epoch")}
    for key, name in (
        ("loss", "loss"),
        ("eval_loss", "eval_loss"),
        ("learning_rate", "lr"),
        ("grad_norm", "grad_norm"),
        ("reward", "reward"),
    ):
        if key in entry:
            point[name] = entry[key]
    return point


def checkpoints(output_dir: str) -> list[str]:
    """checkpoint-N folders, oldest first."""
    found = [path for path in glob.glob(os.path.join(output_dir, "checkpoint-*")) if os.path.isdir(path)]
    return sorted(found, key=lambda path: int(path.rsplit("-", 1)[1]) if path.rsplit("-", 1)[1].isdigit() else -1)


def finished(output_dir: str) -> bool:
    """lathe train (as the Trainer) writes train_results.json / all_results.json when training ends."""
    return any(os.path.isfile(os.path.join(output_dir, name)) for name in ("train_results.json", "all_results.json"))


def log_tail(output_dir: str, size: int = TAIL_BYTES) -> str:
    path = os.path.join(output_dir, JOB_LOG)
    if not os.path.isfile(path):
        return ""
    with open(path, "rb") as f:
        f.seek(max(os.path.getsize(path) - size, 0))
        return f.read().decode("utf-8", errors="replace")


RESULT_FILES = (
    "all_results.json",
    "train_results.json",
    "eval_results.json",
    "predict_results.json",
    "generated_predictions.jsonl",
    "training_loss.png",
)


def result_files(root: str, run: str) -> list[str]:
    """The run's result files (metrics, predictions, the loss plot), relative to the root, for download links."""
    return [f"{run}/{name}" for name in RESULT_FILES if os.path.isfile(os.path.join(root, run, name))]


def summary(root: str, run: str, job_status: str | None) -> dict:
    """What the runs table shows: status (running / finished / stopped / failed / incomplete), progress,
    last loss, tokens/s, elapsed and remaining time."""
    output_dir = os.path.join(root, run)
    points = read_points(output_dir)
    last = points[-1] if points else {}
    if job_status in ("running", "stopping"):
        status = job_status
    elif finished(output_dir):
        status = "finished"
    elif job_status:
        status = job_status
    else:
        status = "incomplete"
    losses = [point["loss"] for point in points if point.get("loss") is not None]
    return {
        "run": run,
        "status": status,
        "step": last.get("current_steps", 0),
        "total_steps": last.get("total_steps"),
        "percentage": last.get("percentage"),
        "loss": losses[-1] if losses else None,
        "throughput": last.get("throughput"),
        "elapsed": last.get("elapsed_time"),
        "remaining": last.get("remaining_time"),
        "checkpoints": [os.path.basename(path) for path in checkpoints(output_dir)],
        "results": result_files(root, run),
    }
