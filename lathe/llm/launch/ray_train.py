"""Ray Train for lathe: the driver of `USE_RAY=1 lathe train` (a TorchTrainer built from the Ray keys), what
each worker runs (`lathe train` in the worker's process, in the process group Ray opened), and for Trainer
scripts the callback that reports every checkpoint to Ray's storage and the checkpoint a restart resumes from."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile

from lathe.llm.launch.ray_settings import import_ray, ray_settings
from lathe.train.callbacks.events import TrainerCallback

__all__ = [
    "RayCheckpointReport",
    "ray_checkpoint",
    "run_with_ray",
    "build_trainer",
    "train_on_worker",
    "last_stored_checkpoint",
]
CHECKPOINT_NAME = "checkpoint"  # Ray's RayTrainReportCallback layout: checkpoint_<...>/checkpoint/


class RayCheckpointReport(TrainerCallback):
    """Reports each checkpoint to Ray Train (ray.train.report) right after the Trainer saved it, with the
    metrics logged so far, as Ray's RayTrainReportCallback (which LLaMA-Factory adds) does: Ray copies it to
    <storage_path>/<run name>/checkpoint_<time>/checkpoint/. Only the process that wrote the checkpoint
    (args.should_save) hands it over; every rank reports, since ray.train.report is a barrier."""

    def on_save(self, args, state, control, **kwargs):
        import ray.train

        metrics = {}
        for entry in state.log_history:
            metrics.update(entry)
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not (args.should_save and os.path.isdir(folder)):
            ray.train.report(metrics=metrics, checkpoint=None)
            return
        with tempfile.TemporaryDirectory() as staging:
            shutil.copytree(folder, os.path.join(staging, CHECKPOINT_NAME))
            ray.train.report(metrics=metrics, checkpoint=ray.train.Checkpoint.from_directory(staging))


@contextlib.contextmanager
def ray_checkpoint(ignore: str | None = None):
    """The folder of the last checkpoint Ray Train stored for this run (after a worker restart, or a rerun
    with the same run name), ready for `trainer.train(resume_from_checkpoint=...)`; None on a fresh run, or
    when that checkpoint's folder is named `ignore`. It stays valid inside the `with` block (Ray may have
    downloaded it to a temporary folder)."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None or (ignore is not None and os.path.basename(checkpoint.path.rstrip("/")) == ignore):
        yield None
        return
    with checkpoint.as_directory() as folder:
        inner = os.path.join(folder, CHECKPOINT_NAME)
        yield inner if os.path.isdir(inner) else folder


def train_on_worker(loop_config: dict) -> None:
    """One rank of `USE_RAY=1 lathe train`: Ray set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT and opened
    the process group; lathe trains in it, reports checkpoints, and resumes from Ray's last one if any."""
    import logging

    import ray.train

    from lathe.llm.config.train import parse_train_config
    from lathe.llm.hub import resolve_config
    from lathe.llm.workflows.plan import format_config, print_once
    from lathe.llm.workflows.stages import run_train

    # lathe's INFO lines as under torchrun; not through the root logger, where Ray Train's print patch sends
    # every print too (a root handler would show each printed line twice)
    lathe_logger = logging.getLogger("lathe")
    if not lathe_logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s|%(name)s] %(message)s"))
        lathe_logger.addHandler(handler)
        lathe_logger.setLevel(logging.INFO)
        lathe_logger.propagate = False
    os.environ["USE_RAY"] = "1"  # the config's Ray keys are the driver's, not errors, on every node
    if os.path.isdir(loop_config["cwd"]):  # relative paths in the config mean the driver's directory
        os.chdir(loop_config["cwd"])
    # A checkpoint from an earlier launch with this run name is not resumed (as LLaMA-Factory: a new launch
    # resumes from output_dir unless overwrite_output_dir); one stored during this launch is (a restart).
    with ray_checkpoint(ignore=loop_config.get("stored_before")) as resume:
        overrides = list(loop_config["overrides"])
        if resume is not None:
            if ray.train.get_context().get_world_rank() == 0:
                print(f"lathe train: resuming from the checkpoint Ray Train stored: {resume}", flush=True)
            overrides.append(f"resume_from_checkpoint={resume}")
        config = parse_train_config(loop_config["config"], overrides)
        resolve_config(config)
        print_once(config, format_config(config))
        run_train(config, callbacks=[RayCheckpointReport()])


def init_kwargs(settings: dict, verbose: bool = False) -> dict:
    """ray.init's arguments: ray_init_kwargs, and Ray's own INFO lines (local instance started, placement
    groups, autoscaler) quieted to warnings unless --verbose or ray_init_kwargs sets logging_level."""
    kwargs = dict(settings["init_kwargs"])
    if not verbose:
        kwargs.setdefault("logging_level", "warning")
    return kwargs


def run_with_ray(raw, config_path, overrides: list[str], verbose: bool = False) -> int:
    """Train on ray_num_workers Ray Train workers; 0 when the run finished, 1 when a worker failed after the
    restarts ray_max_failures allows. raw: the RawConfig the command read from config_path and overrides (each
    worker reads the file again, in its own process). The config is checked here first: a wrong key is one
    line, no worker. Ray's own INFO logs (its start, the controller's placement-group lines) are quieted unless
    `verbose`."""
    from lathe.llm.config.train import parse_train_config

    settings = ray_settings(raw.values)
    parse_train_config(raw)
    ray = import_ray()
    # Ray Train's print patch sends each print to its logger as well as to stdout: every line lathe prints
    # would reach the terminal twice. Off unless the user set it (Ray passes it on to the workers).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(**init_kwargs(settings, verbose))
    elif settings["init_kwargs"]:
        print("lathe train: Ray is already initialized in this process; ray_init_kwargs are not applied.")
    try:
        from ray.train import TrainingFailedError

        trainer = build_trainer(ray, settings, config_path, overrides, verbose)
        try:
            result = trainer.fit()
        except TrainingFailedError as error:  # Ray printed the workers' tracebacks; one line says what it means
            print(f"lathe train: error: {_failure_message(error, settings)}", file=sys.stderr, flush=True)
            return 1
        print(f"lathe train: Ray Train finished; its run (checkpoints, metrics) is in {result.path}", flush=True)
        return 0
    finally:
        if started_here:
            ray.shutdown()


def _logging_config(train, verbose: bool) -> dict:
    if not hasattr(train, "LoggingConfig"):  # older Ray Train: no such setting
        return {}
    return {"logging_config": train.LoggingConfig(log_level="INFO" if verbose else "WARNING")}


def build_trainer(ray, settings: dict, config_path, overrides: list[str], verbose: bool = False):
    """The TorchTrainer LLaMA-Factory 0.9.4 builds (get_ray_trainer), with ddp_backend / ddp_timeout for the
    process group Ray opens and FailureConfig(max_failures=ray_max_failures); Ray Train's own INFO logs
    (worker group and placement-group lines) at WARNING unless `verbose`."""
    from ray import train as ray_train_api
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    resources = settings["resources_per_worker"] or _default_resources(ray)
    _check_cluster(ray, resources, settings["num_workers"])
    filesystem = _filesystem(settings["storage_filesystem"])
    storage = settings["storage_path"] if filesystem else os.path.abspath(settings["storage_path"])
    path = os.path.abspath(config_path) if os.path.exists(str(config_path)) else str(config_path)
    print(
        f"lathe train: {settings['num_workers']} Ray Train worker(s) (TorchTrainer), {resources} each, placement "
        f"{settings['placement_strategy']}, ray_max_failures={settings['max_failures']}; checkpoints also go to "
        f"{storage}/{settings['run_name'] or '<a new run name>'}",
        flush=True,
    )
    return TorchTrainer(
        train_on_worker,
        train_loop_config={
            "cwd": os.getcwd(),
            "config": path,
            "overrides": list(overrides),
            "stored_before": last_stored_checkpoint(filesystem, storage, settings["run_name"]),
        },
        scaling_config=ScalingConfig(
            num_workers=settings["num_workers"],
            resources_per_worker=resources,
            placement_strategy=settings["placement_strategy"],
            use_gpu=resources.get("GPU", 0) > 0,
        ),
        torch_config=TorchConfig(backend=settings["ddp_backend"], timeout_s=settings["ddp_timeout"]),
        run_config=RunConfig(
            name=settings["run_name"],
            storage_path=storage,
            storage_filesystem=filesystem,
            failure_config=FailureConfig(max_failures=settings["max_failures"]),
            **_logging_config(ray_train_api, verbose),
        ),
    )


def last_stored_checkpoint(filesystem, storage: str, run_name: str | None) -> str | None:
    """The folder name of the last checkpoint an earlier launch of this run stored (Ray Train's snapshot)."""
    if run_name is None:  # Ray names each launch anew
        return None
    import json

    import pyarrow.fs

    filesystem = filesystem or pyarrow.fs.LocalFileSystem()
    try:
        with filesystem.open_input_stream(f"{storage}/{run_name}/checkpoint_manager_snapshot.json") as stream:
            latest = json.loads(stream.read()).get("latest_checkpoint_result") or {}
    except (OSError, ValueError):  # no earlier launch (or an unreadable snapshot: Ray will say so)
        return None
    return latest.get("checkpoint_dir_name")


def _default_resources(ray) -> dict:
    """LLaMA-Factory's {"GPU": 1}; {"CPU": 1} on a cluster without GPUs (where a GPU per worker never comes)."""
    return {"GPU": 1} if ray.cluster_resources().get("GPU", 0) > 0 else {"CPU": 1}


def _check_cluster(ray, resources: dict, workers: int) -> None:
    """On a cluster of fixed size Ray would wait for resources it never gets: say so instead. An autoscaling
    cluster (one with a cluster config) may grow; Ray Train checks against its maximum itself."""
    try:
        from ray._private.state import state

        if state.get_max_resources_from_cluster_config():
            return
    except (ImportError, AttributeError, RuntimeError):  # a private API: if it moves, check the present size
        pass
    total = ray.cluster_resources()
    for name, amount in resources.items():
        if amount * workers > total.get(name, 0):
            raise ValueError(
                f"ray_num_workers={workers} x resources_per_worker {name}={amount} needs {amount * workers:g} "
                f"{name}, but the Ray cluster has {total.get(name, 0):g}."
            )


def _filesystem(name: str | None):
    if name is None:
        return None
    import pyarrow.fs

    return pyarrow.fs.S3FileSystem() if name == "s3" else pyarrow.fs.GcsFileSystem()


def _failure_message(error, settings: dict) -> str:
    lines = [line for line in str(getattr(error, "__cause__", None) or error).strip().splitlines() if line.strip()]
    return (
        f"Ray Train stopped: a worker failed ({(lines[-1] if lines else '?')[:300]}) after "
        f"ray_max_failures={settings['max_failures']} restart(s). Run the same command again: training resumes "
        "from the last checkpoint in output_dir (unless overwrite_output_dir; or give resume_from_checkpoint, "
        "e.g. the last one Ray stored)."
    )
