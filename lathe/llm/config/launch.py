"""The keys `lathe train` reads before the ranks start, and their checks at parse time: torchrun's launch keys
(LAUNCH_KEYS, LLaMA-Factory's names and environment variables) and the Ray keys of USE_RAY=1 (RAY_KEYS,
check_ray_keys). lathe.llm.launch reads their values; the config owns the names, so parse_train_config
knows them without importing the launchers."""

from __future__ import annotations

import json
import os

# config key -> environment variable (LLaMA-Factory's) and default
LAUNCH_KEYS = {
    "nproc_per_node": "NPROC_PER_NODE",
    "nnodes": "NNODES",
    "node_rank": "NODE_RANK",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
}


# LLaMA-Factory 0.9.4's RayArguments and their defaults; ray_max_failures is lathe's (Ray's FailureConfig).
RAY_DEFAULTS = {
    "ray_num_workers": 1,
    "ray_init_kwargs": None,
    "ray_run_name": None,
    "ray_storage_path": "./saves",
    "ray_storage_filesystem": None,
    "resources_per_worker": None,  # LLaMA-Factory: {"GPU": 1}; here {"CPU": 1} on a cluster without GPUs
    "placement_strategy": "PACK",
    "ray_max_failures": 0,
}
RAY_KEYS = tuple(RAY_DEFAULTS)
RAY_KEYS = tuple(RAY_DEFAULTS)


def use_ray(environ=None) -> bool:
    environ = os.environ if environ is None else environ
    return (environ.get("USE_RAY") or "").strip().lower() in ("1", "true", "y", "yes")


def check_ray_keys(raw: dict, origin) -> None:
    """Without USE_RAY=1 a Ray key away from LLaMA-Factory's default would do nothing (LLaMA-Factory ignores
    it and trains on one process): an error. origin(key) says where a key was given."""
    if use_ray():
        return
    defaults = {**RAY_DEFAULTS, "resources_per_worker": {"GPU": 1}}
    given = [key for key in RAY_KEYS if key in raw and _normal(raw[key]) != _normal(defaults[key])]
    if given:
        named = ", ".join(f"{key}{origin(key)}" for key in given)
        raise ValueError(
            f"{named} {'is' if len(given) == 1 else 'are'} read only with USE_RAY=1, which runs lathe train on Ray "
            "Train workers (LLaMA-Factory then ignores them and trains on one process): set USE_RAY=1, or remove "
            f"{'it' if len(given) == 1 else 'them'}."
        )


def _normal(value):
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value if isinstance(value, dict) else str(value)
