"""The Ray keys of `USE_RAY=1 lathe train` (LLaMA-Factory 0.9.4's RayArguments, and ray_max_failures): read from
the config and the command line and checked, without importing Ray. The run itself: lathe.llm.launch.ray_train."""

from __future__ import annotations

import json

from lathe.llm.config.launch import RAY_DEFAULTS

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
FILESYSTEMS = ("s3", "gs", "gcs")
INSTALL_HINT = "USE_RAY=1 runs lathe train on Ray Train: pip install 'lathe[ray]' (ray[train])."


def _mapping(values: dict, key: str):
    value = values.get(key)
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"{key} is not valid JSON ({error}).") from None
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{key} must be a mapping, got {value!r}.")
    return value


def _whole(values: dict, key: str, least: int) -> int:
    value = values.get(key, RAY_DEFAULTS[key])
    text = str(value).strip()
    if not (text.isdigit() or (least < 0 and text == "-1")) or int(text) < least:
        raise ValueError(f"{key} must be a whole number of at least {least}, got {value!r}.")
    return int(text)


def ray_settings(values: dict) -> dict:
    """The Ray keys from the config and the command line (RawConfig.values, read once by the command),
    checked (mappings may be given as JSON)."""
    for key in ("master_addr", "master_port"):
        if values.get(key) is not None:
            raise ValueError(
                f"{key} is given with USE_RAY=1: Ray Train opens the process group itself, on rank 0's node at a "
                f"free port (LLaMA-Factory 0.9.5's {key} has no Ray Train counterpart): remove it."
            )
    for key in ("nproc_per_node", "nnodes", "node_rank"):  # torchrun's, in the config or on the command line
        if values.get(key) is not None:
            raise ValueError(f"{key} is given with USE_RAY=1: Ray Train starts ray_num_workers workers; remove it.")
    resources = _mapping(values, "resources_per_worker")
    for name, amount in (resources or {}).items():
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or amount < 0:
            raise ValueError(f"resources_per_worker[{name!r}] must be a number of at least 0, got {amount!r}.")
    strategy = str(values.get("placement_strategy", "PACK"))
    if strategy not in PLACEMENT_STRATEGIES:
        raise ValueError(f"placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, got {strategy!r}.")
    filesystem = values.get("ray_storage_filesystem")
    if filesystem is not None and filesystem not in FILESYSTEMS:
        raise ValueError(
            f"ray_storage_filesystem must be one of {', '.join(FILESYSTEMS)} (or unset), got {filesystem!r}."
        )
    run_name = values.get("ray_run_name")
    timeout = values.get("ddp_timeout", 1800)
    if not str(timeout).isdigit():
        raise ValueError(f"ddp_timeout must be a whole number of seconds, got {timeout!r}.")
    return {
        "num_workers": _whole(values, "ray_num_workers", 1),
        "init_kwargs": _mapping(values, "ray_init_kwargs") or {},
        "run_name": None if run_name is None else str(run_name),
        "storage_path": str(values.get("ray_storage_path") or "./saves"),
        "storage_filesystem": filesystem,
        "resources_per_worker": resources,
        "placement_strategy": strategy,
        "max_failures": _whole(values, "ray_max_failures", -1),
        "ddp_backend": values.get("ddp_backend"),
        "ddp_timeout": int(timeout),
    }


def import_ray():
    """ray, with Ray Train's torch trainer importable (ray[train]); else an ImportError with the extra."""
    try:
        import ray
        import ray.train.torch  # noqa: F401  (needs ray[train]'s packages: pyarrow, pandas, ...)
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} ({error})") from None
    return ray
