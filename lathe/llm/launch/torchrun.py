"""`lathe train` on several processes: the command relaunches itself under torchrun
(`python -m torch.distributed.run`), as `llamafactory-cli train` does, and every rank then runs the
same recipe (lathe.train runs DDP / FSDP2 under it; lathe.llm.data preprocesses on rank 0 first).

When: FORCE_TORCHRUN=1, or more than one process per node asked for (`nproc_per_node` in the config or
on the command line, else NPROC_PER_NODE), or several nodes (NNODES), or more than one CUDA device
(as LLaMA-Factory); with USE_RAY=1, Ray Train starts them instead (lathe.llm.launch.ray_train). Where: NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT (or the config keys nnodes,
node_rank, master_addr, master_port), LLaMA-Factory's names. Never inside a torchrun launch already.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile

from lathe.llm.config.launch import LAUNCH_KEYS, use_ray

logger = logging.getLogger(__name__)

ERROR_FILE_VARIABLE = "LATHE_LAUNCH_ERRORS"


def under_launcher() -> bool:
    return "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "y", "yes")


def launch_settings(values: dict, environ=None, cuda_devices=None) -> dict | None:
    """torchrun's settings when this `lathe train` must run on several processes, else None. values: the
    config's keys with the command line's on top (RawConfig.values, read once by the command)."""
    environ = os.environ if environ is None else environ
    if under_launcher():
        return None
    chosen = {key: values.get(key, environ.get(variable)) for key, variable in LAUNCH_KEYS.items()}
    for key in ("nproc_per_node", "nnodes", "node_rank", "master_port"):
        if chosen[key] is not None and not str(chosen[key]).isdigit():
            raise ValueError(f"{key} (or {LAUNCH_KEYS[key]}) must be a whole number, got {chosen[key]!r}.")
    if chosen["nproc_per_node"] is None:
        devices = _cuda_devices() if cuda_devices is None else cuda_devices
        chosen["nproc_per_node"] = max(devices, 1)
    settings = {
        "nproc_per_node": int(chosen["nproc_per_node"]),
        "nnodes": int(chosen["nnodes"] or 1),
        "node_rank": int(chosen["node_rank"] or 0),
        "master_addr": chosen["master_addr"] or "127.0.0.1",
        "master_port": int(chosen["master_port"] or 0),
    }
    if settings["nproc_per_node"] < 1:
        raise ValueError(f"nproc_per_node must be at least 1, got {settings['nproc_per_node']}.")
    if not (_truthy(environ.get("FORCE_TORCHRUN")) or settings["nproc_per_node"] > 1 or settings["nnodes"] > 1):
        return None
    if not settings["master_port"]:
        if settings["nnodes"] > 1:
            raise ValueError(
                "Several nodes (NNODES > 1) need MASTER_ADDR and MASTER_PORT: every node must name the same."
            )
        settings["master_port"] = _free_port()
    return settings


def planned_processes(values: dict) -> int:
    """How many processes, over all nodes, `lathe train` would run: ray_num_workers with USE_RAY=1,
    else nnodes x nproc_per_node when it relaunches under torchrun, else 1 (for a dry run's plan)."""
    from lathe.llm.launch.ray_settings import ray_settings

    if use_ray():
        return ray_settings(values)["num_workers"]
    settings = launch_settings(values)
    return settings["nnodes"] * settings["nproc_per_node"] if settings else 1


def torchrun_command(settings: dict, config_path, overrides: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={settings['nnodes']}",
        f"--node_rank={settings['node_rank']}",
        f"--nproc_per_node={settings['nproc_per_node']}",
        f"--master_addr={settings['master_addr']}",
        f"--master_port={settings['master_port']}",
        "-m",
        "lathe",
        "train",
        str(config_path),
        *without_launch_keys(overrides),
    ]


def without_launch_keys(overrides: list[str]) -> list[str]:
    """The overrides the ranks get: the launch keys (`nproc_per_node=2`, `--nnodes 2`) are the launcher's."""
    result, skip_value = [], False
    for item in overrides:
        if skip_value:
            skip_value = False
            if not item.startswith("--"):
                continue
        key = item.lstrip("-").split("=", 1)[0].replace("-", "_")
        if key in LAUNCH_KEYS:
            skip_value = item.startswith("--") and "=" not in item
            continue
        result.append(item)
    return result


def ray_wanted() -> bool:
    """USE_RAY=1 outside a launcher: Ray Train starts the ranks (lathe.llm.launch.ray_train), not torchrun."""
    if not use_ray() or under_launcher():
        return False
    if _truthy(os.environ.get("FORCE_TORCHRUN")):
        raise ValueError("USE_RAY=1 and FORCE_TORCHRUN=1 both ask to start the processes: set one of them.")
    return True


def relaunch(settings: dict, config_path, overrides: list[str]) -> int:
    """Run `lathe train` under torchrun with launch_settings' `settings`; its exit code. Each rank reads the
    config file itself (a process of its own), with the launch keys left out of its overrides."""
    command = torchrun_command(settings, config_path, overrides)
    print(
        f"lathe train: {settings['nproc_per_node']} process(es) per node x {settings['nnodes']} node(s), "
        f"rendezvous at {settings['master_addr']}:{settings['master_port']}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="lathe-launch-") as folder:
        errors = os.path.join(folder, "errors.txt")  # each rank's one-line error (commands.py writes it)
        try:
            code = subprocess.run(command, env={**os.environ, ERROR_FILE_VARIABLE: errors}).returncode
        except KeyboardInterrupt:  # torchrun got the same signal and stops its workers
            return 130
        if code != 0:
            print_rank_errors(errors)
    return code


def print_rank_errors(path: str) -> None:
    """The ranks' error lines, once each, printed after torchrun's own report (its ChildFailedError traceback
    would bury them otherwise)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(dict.fromkeys(line.rstrip("\n") for line in f if line.strip()))
    except OSError:
        return
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def record_error(line: str) -> None:
    """Under lathe's launcher, add this rank's error line to the file the launcher prints last."""
    path = os.environ.get(ERROR_FILE_VARIABLE)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line.replace("\n", " ") + "\n")
        except OSError:
            pass


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
