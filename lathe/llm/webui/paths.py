"""Where the web page may read and write: every path a form or a request names resolves under the root.

`inside` is the one helper: it resolves a value (relative to the root, or absolute; `..` and symbolic links
followed) and refuses anything that lands outside the root. `check_config_paths` applies it to every
path-valued config key (PATH_KEYS; tests/llm/test_webui_paths.py derives the path-valued keys from the config
dataclasses and fails when one is missing here), `check_dataset_files` to the files a dataset_info.json
names."""

from __future__ import annotations

import json
import os
import re

# Keys whose values are files or folders. Any other key ending like these counts too (see is_path_key).
MODEL_KEYS = ("model_name_or_path", "ref_model", "reward_model", "generation_config")  # a folder or a hub id
LIST_KEYS = ("adapter_name_or_path", "ref_model_adapters")  # comma-separated folders or hub ids
JSON_KEYS = ("deepspeed", "fsdp_config", "accelerator_config")  # a dict, a JSON string or a JSON file
PATH_KEYS = {
    *MODEL_KEYS,
    *LIST_KEYS,
    *JSON_KEYS,
    "dataset_dir",
    "media_dir",
    "output_dir",
    "logging_dir",
    "export_dir",
    "resume_from_checkpoint",
    "tokenized_path",
    "cache_dir",
    "reward_funcs",
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


def _items(value) -> list:
    return [item.strip() for item in value.split(",") if item.strip()] if isinstance(value, str) else list(value)


def checked_reward(root: str, spec, search_dirs: tuple[str, ...], key: str = "reward_funcs") -> str:
    """A reward function the page may name: a model folder under root, or `module:function` whose module is
    a .py file under root (in one of `search_dirs`, where `lathe train` looks first): never a module found
    elsewhere on sys.path. The same for the other code a GRPO config names (`key`: rollout_func, tools,
    environment_factory), which are `module:name` only."""
    if not isinstance(spec, str) or not spec.strip():
        raise PathError(f"{key}: expected 'module:name'{' or a model folder' * (key == 'reward_funcs')}, got {spec!r}.")
    module, colon, function = spec.strip().partition(":")
    if not colon and key == "reward_funcs":
        return inside(root, spec, "reward_funcs")
    valid_module = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", module)
    if not colon or not valid_module or not function.isidentifier():
        raise PathError(f"{key}: {spec!r} is not 'module:name'.")
    relative_file = os.path.join(*module.split(".")) + ".py"
    for folder in search_dirs:
        candidate = os.path.join(folder, relative_file)
        if os.path.isfile(candidate):
            inside(root, candidate, key)  # a link to a file outside is refused
            return spec.strip()
    raise PathError(
        f"{key}: module {module!r} is not a .py file under the web page's root (the page runs a run's own "
        f"code from the root only; looked for {relative_file} in {', '.join(search_dirs)})."
    )


# Keys naming code a run imports (module:name), checked as reward_funcs' modules are: .py files under the root.
CODE_KEYS = ("rollout_func", "tools", "environment_factory")


def _checked_code(root: str, key: str, value, dirs: tuple[str, ...]):
    if key == "environment_factory":
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise PathError(f"environment_factory: not a JSON mapping ({error.msg}).") from None
        if isinstance(value, dict):
            return {name: checked_reward(root, spec, dirs, key) for name, spec in value.items()}
        return checked_reward(root, value, dirs, key)
    if key == "tools":
        return [checked_reward(root, item, dirs, key) for item in _items(value)]
    return checked_reward(root, value, dirs, key)


def check_config_paths(root: str, values: dict, search_dirs: tuple[str, ...] = ()) -> dict:
    """The config with every path value made absolute under root; PathError for any that escapes.
    Model keys may also be hub ids; comma-separated lists are checked one by one; deepspeed / fsdp_config /
    accelerator_config may be given inline (a dict or a JSON string); reward modules are looked up in
    `search_dirs` (default: the root)."""
    checked = dict(values)
    for key, value in values.items():
        if value is None or value == "" or isinstance(value, bool):
            continue
        if key in CODE_KEYS:
            checked[key] = _checked_code(root, key, value, search_dirs or (root,))
            continue
        if not is_path_key(key):
            continue
        if key in MODEL_KEYS:
            checked[key] = checked_model(root, str(value), key)
        elif key in LIST_KEYS:
            checked[key] = ",".join(checked_model(root, item, key) for item in _items(value))
        elif key == "reward_funcs":
            dirs = search_dirs or (root,)
            checked[key] = [checked_reward(root, item, dirs) for item in _items(value)]
        elif key in JSON_KEYS and (isinstance(value, dict) or str(value).lstrip().startswith("{")):
            continue
        elif key == "resume_from_checkpoint" and str(value).lower() in ("true", "false"):
            continue
        elif isinstance(value, str):
            checked[key] = inside(root, value, key)
        else:
            raise PathError(f"{key}: expected a path (a string), got {value!r}.")
    return checked


def check_dataset_files(root: str, dataset_dir: str, info: dict, names=None, where: str = "dataset_info.json"):
    """Each entry of a dataset_info.json (those in `names`, or all) whose `file_name` is a file or folder:
    it must resolve under root (relative to dataset_dir, as lathe train reads it). Hub and remote entries
    name no local file."""
    if not isinstance(info, dict):
        raise ValueError(f"{where}: expected an object of datasets.")
    for name in info if names is None else names:
        entry = info.get(name)
        if isinstance(entry, dict) and entry.get("file_name") is not None:
            if not isinstance(entry["file_name"], str):
                raise ValueError(f"{where}: dataset {name!r}: file_name must be a string.")
            inside(root, os.path.join(dataset_dir, entry["file_name"]), f"{where}: dataset {name!r} file_name")


def relative(root: str, path: str) -> str:
    """`path` relative to the root, with forward slashes (how the page names runs)."""
    return os.path.relpath(os.path.realpath(path), os.path.realpath(root)).replace(os.sep, "/")
