"""`lathe train` on a Ray cluster, as LLaMA-Factory runs it with USE_RAY=1: ray.init(**ray_init_kwargs),
a placement group of ray_num_workers bundles (one accelerator each where the cluster has GPUs, else one
CPU), and one Ray actor per bundle that runs the same `lathe train` as a torchrun rank, with RANK,
WORLD_SIZE, MASTER_ADDR (the head node unless master_addr names another node) and MASTER_PORT set.
Checkpoints and the model go to output_dir, as under torchrun; Ray is imported here only."""

from __future__ import annotations

import json
import logging
import os

from lathe.llm.config.values import parse_overrides, read_source

logger = logging.getLogger(__name__)

RAY_KEYS = ("ray_num_workers", "ray_init_kwargs")
INSTALL_HINT = "Ray runs lathe train only when it is installed: pip install 'lathe[ray]' (ray[train])."


def use_ray(environ=None) -> bool:
    environ = os.environ if environ is None else environ
    return (environ.get("USE_RAY") or "").strip().lower() in ("1", "true", "y", "yes")


def ray_settings(config_path, overrides: list[str]) -> dict:
    """ray_num_workers (a whole number, at least 1), ray_init_kwargs (a mapping, or its JSON), master_addr
    and master_port, from the config and the command line (LLaMA-Factory's RayArguments)."""
    values, _ = read_source(config_path)
    values.update(parse_overrides(overrides))
    workers = values.get("ray_num_workers", 1)
    if not str(workers).isdigit() or int(workers) < 1:
        raise ValueError(f"ray_num_workers must be a whole number of at least 1, got {workers!r}.")
    init_kwargs = values.get("ray_init_kwargs")
    if isinstance(init_kwargs, str) and init_kwargs.strip().startswith("{"):
        try:
            init_kwargs = json.loads(init_kwargs)
        except json.JSONDecodeError as error:
            raise ValueError(f"ray_init_kwargs is not valid JSON ({error}).") from None
    if init_kwargs is not None and not isinstance(init_kwargs, dict):
        raise ValueError(f"ray_init_kwargs must be a mapping of ray.init's arguments, got {init_kwargs!r}.")
    port = values.get("master_port")
    if port is not None and not str(port).isdigit():
        raise ValueError(f"master_port must be a whole number, got {port!r}.")
    return {
        "num_workers": int(workers),
        "init_kwargs": init_kwargs or {},
        "master_addr": values.get("master_addr"),
        "master_port": int(port) if port is not None else None,
    }


def import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError(f"USE_RAY=1: {INSTALL_HINT}") from None
    return ray


def run_with_ray(config_path, overrides: list[str]) -> int:
    """Train on ray_num_workers Ray actors; the exit code (0 when every worker finished)."""
    settings = ray_settings(config_path, overrides)
    ray = import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(**settings["init_kwargs"])
    try:
        device = _accelerator()
        available = int(ray.cluster_resources().get(device, 0))
        count = settings["num_workers"]
        if count > available:
            raise ValueError(
                f"ray_num_workers is {count}, but the Ray cluster has {available} {device}(s): one per worker is needed."
            )
        bundle = {"CPU": 1, **({device: 1} if device != "CPU" else {})}
        group = placement_group([dict(bundle) for _ in range(count)], strategy="PACK")
        ray.get(group.ready())
        master_addr = _master_address(ray, settings["master_addr"])
        order = _bundles_master_first(ray, group, master_addr)
        master_port = settings["master_port"] or ray.get(_free_port_on(ray, group, order[0]))
        print(
            f"lathe train: {count} Ray worker(s), one {device} each, rendezvous at {master_addr}:{master_port}",
            flush=True,
        )
        workers = [
            _start_worker(ray, group, index, rank, count, master_addr, master_port, device)
            for rank, index in enumerate(order)
        ]
        path = os.path.abspath(config_path) if os.path.exists(str(config_path)) else config_path
        try:
            codes = ray.get([worker.train.remote(os.getcwd(), path, overrides) for worker in workers])
        except ray.exceptions.RayActorError as error:
            raise RuntimeError(
                f"A Ray worker died during training ({str(error).strip().splitlines()[0][:300]}). Run the same "
                "command again: training resumes from the last checkpoint in output_dir (unless overwrite_output_dir)."
            ) from None
        remove_placement_group(group)
        return max(codes)
    finally:
        if started_here:
            ray.shutdown()


def _accelerator() -> str:
    import torch

    return "GPU" if torch.cuda.is_available() else "CPU"


def _master_address(ray, asked: str | None) -> str:
    """The head node's address by default; a named master_addr must be a live node of the cluster."""
    alive = [node for node in ray.nodes() if node.get("Alive")]
    if asked is not None:
        if asked not in [node["NodeManagerAddress"] for node in alive]:
            raise ValueError(f"master_addr {asked!r} is not a live node of the Ray cluster.")
        return asked
    heads = [node["NodeManagerAddress"] for node in alive if "node:__internal_head__" in node.get("Resources", {})]
    return heads[0] if heads else ray.util.get_node_ip_address()


def _bundles_master_first(ray, group, master_addr: str) -> list[int]:
    """Bundle indices sorted by node address, those on the master's node first (rank 0 lives there)."""
    task = ray.remote(num_cpus=0)(_node_address)
    addresses = ray.get(
        [task.options(scheduling_strategy=_in(group, index)).remote() for index in range(group.bundle_count)]
    )
    ordered = sorted(range(len(addresses)), key=lambda index: addresses[index])
    return [i for i in ordered if addresses[i] == master_addr] + [i for i in ordered if addresses[i] != master_addr]


def _free_port_on(ray, group, index: int):
    return ray.remote(num_cpus=0)(_free_port).options(scheduling_strategy=_in(group, index)).remote()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _in(group, index: int):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


def _node_address() -> str:
    import ray

    return ray.util.get_node_ip_address().strip("[]")


def _start_worker(ray, group, index: int, rank: int, count: int, master_addr: str, master_port: int, device: str):
    environment = dict(os.environ)
    environment.update(
        RANK=str(rank),
        WORLD_SIZE=str(count),
        LOCAL_RANK="0",  # each actor sees its own accelerator (Ray sets CUDA_VISIBLE_DEVICES)
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        TORCHELASTIC_USE_AGENT_STORE="False",
    )
    options = {"scheduling_strategy": _in(group, index), "runtime_env": {"env_vars": environment}, "num_cpus": 1}
    if device == "GPU":
        options["num_gpus"] = 1
    return ray.remote(RayWorker).options(**options).remote()


class RayWorker:
    """One rank: `lathe train` in a child of this actor (its environment: the rank's variables), from
    the driver's working directory; its output reaches the driver through Ray's log forwarding."""

    def train(self, cwd: str, config_path: str, overrides: list[str]) -> int:
        import subprocess
        import sys

        return subprocess.run([sys.executable, "-m", "lathe", "train", config_path, *overrides], cwd=cwd).returncode
