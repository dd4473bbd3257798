"""Where the web page may read and write: every path a form or a request names resolves under the root."""

from __future__ import annotations

import os
import re

# Keys whose values are files or folders. Any other key ending like these counts too (see is_path_key).
PATH_KEYS = {
    "model_name_or_path",
    "adapter_name_or_path",
    "dataset_dir",
    "media_dir",
    "output_dir",
    "logging_dir",
    "export_dir",
    "resume_from_checkpoint",
    "tokenized_path",
    "deepspeed",
    "cache_dir",
    "ref_model",
    "reward_model",
}
PATH_SUFFIXES = ("_dir", "_path", "_file", "_folder")
# A hub id: "org/name" (LLaMA-Factory downloads it); it must not exist as a folder under the root.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class PathError(ValueError):
    """A path outside the web page's root (or not a path at all)."""


def is_path_key(key: str) -> bool:
    return key in PATH_KEYS or key.endswith(PATH_SUFFIXES)


def inside(root: str, value: str, what: str = "path") -> str:
    """`value` (relative to root, or absolute) as a real absolute path, which must lie under root once
    symbolic links are followed; else PathError naming `what`."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise PathError(f"{what}: expected a path under the web page's root, got {value!r}.")
    real_root = os.path.realpath(root)
    full = os.path.realpath(os.path.join(real_root, os.path.expanduser(value.strip())))
    if full != real_root and not full.startswith(real_root + os.sep):
        raise PathError(f"{what}: {value!r} is outside the web page's root {real_root} (paths stay under it).")
    return full


def checked_model(root: str, value: str, what: str = "model_name_or_path") -> str:
    """A model folder under root, or a hub id (org/name) whose `org` is nothing under root (not even a link:
    `link/x`, with `link` pointing elsewhere, is a path, and so checked)."""
    if (
        isinstance(value, str)
        and HUB_ID.match(value.strip())
        and not os.path.lexists(os.path.join(root, value.strip().split("/")[0]))
    ):
        return value.strip()
    return inside(root, value, what)


def check_config_paths(root: str, values: dict) -> dict:
    """The config with every path value made absolute under root; PathError for any that escapes.
    Model keys may also be hub ids; comma-separated adapter lists are checked one by one."""
    checked = dict(values)
    for key, value in values.items():
        if value is None or value == "" or not is_path_key(key) or isinstance(value, bool):
            continue
        if key in ("model_name_or_path", "ref_model", "reward_model"):
            checked[key] = checked_model(root, str(value), key)
        elif key == "adapter_name_or_path":
            checked[key] = ",".join(checked_model(root, item, key) for item in str(value).split(","))
        elif key == "resume_from_checkpoint" and str(value).lower() in ("true", "false"):
            continue
        elif isinstance(value, str):
            checked[key] = inside(root, value, key)
        else:
            raise PathError(f"{key}: expected a path (a string), got {value!r}.")
    return checked


def relative(root: str, path: str) -> str:
    """`path` relative to the root, with forward slashes (how the page names runs)."""
    return os.path.relpath(os.path.realpath(path), os.path.realpath(root)).replace(os.sep, "/")
