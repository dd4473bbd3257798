"""Run by test_reporters.py in a fresh process (the trackers read their folders from the environment at import):
train a tiny model with report_to=wandb, mlflow, trackio, offline, then read back what each stored and print
it as JSON beside the Trainer's log_history."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from lathe import Trainer
from tests.train.trainer_helpers import Regression, regression_items, training_args


def wandb_records(path: Path):
    """The protobuf records of a .wandb file (LevelDB log format: 32 KiB blocks, 7-byte record headers)."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending = path.read_bytes(), 7, b""  # after the ":W&B" file header
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a FULL record, or the LAST piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def finished_wandb_records(folder: Path) -> list:
    """The run's records once wandb's writer (a separate process) has written the last one, `exit`."""
    for _ in range(300):
        paths = list(folder.glob("wandb/offline-run-*/run-*.wandb"))
        records = list(wandb_records(paths[0])) if len(paths) == 1 else []
        if records and records[-1].WhichOneof("record_type") == "exit":
            return records
        time.sleep(0.1)
    raise TimeoutError(f"wandb wrote no complete run under {folder} within 30 s")


def read_wandb(folder: Path) -> dict:
    history, summary, config, name = [], {}, {}, None
    for record in finished_wandb_records(folder):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "summary":
            summary.update({item.key: json.loads(item.value_json) for item in record.summary.update if item.key})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "run":
            name = name or record.run.display_name or None
    return {"history": history, "summary": summary, "name": name, "learning_rate": config.get("learning_rate")}


def read_mlflow(uri: str) -> dict:
    import mlflow

    client = mlflow.tracking.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    metrics = {
        # mlflow's file store returns a metric's history in no promised order; the step says where a point belongs
        key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        for key in run.data.metrics
    }
    return {"metrics": metrics, "params": run.data.params, "name": run.info.run_name, "status": run.info.status}


def read_trackio(project: str) -> dict:
    from trackio.sqlite_storage import SQLiteStorage

    (run,) = SQLiteStorage.get_runs(project)
    return {"run": run, "logs": SQLiteStorage.get_logs(project, run)}


def main(folder: Path) -> None:
    args = training_args(
        folder / "out",
        max_steps=4,
        logging_steps=2,
        report_to=["wandb", "mlflow", "trackio"],
        run_name="tiny",
        project="lathe-tests",
    )
    trainer = Trainer(model=Regression(), args=args, train_dataset=regression_items(12))
    trainer.train()
    import wandb

    wandb.finish()
    result = {
        "log_history": trainer.state.log_history,
        "wandb": read_wandb(folder),
        "mlflow": read_mlflow((folder / "mlruns").as_uri()),
        "trackio": read_trackio("lathe-tests"),
    }
    print("RESULT " + json.dumps(result, default=str))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
