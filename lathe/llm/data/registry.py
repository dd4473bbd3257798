"""The dataset registry: `dataset_dir/dataset_info.json` (LLaMA-Factory's schema) -> `DatasetAttr`.

Every error names the registry file, the dataset and the key at fault. Semantics follow LLaMA-Factory
0.9.5 where a config works there; where it would crash or silently train on nothing, lathe says why.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from lathe.llm.path_typos import folder_hint
from lathe.llm.strict_files import did_you_mean, load_json

DATA_CONFIG = "dataset_info.json"
FORMATTINGS = ("alpaca", "sharegpt", "openai")
# File extension -> the `datasets` builder that reads it.
FILE_TYPES = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet", "txt": "text", "arrow": "arrow"}

COLUMN_NAMES = (
    "prompt",
    "query",
    "response",
    "history",
    "messages",
    "system",
    "tools",
    "images",
    "videos",
    "audios",
    "chosen",
    "rejected",
    "kto_tag",
)
TAG_NAMES = ("role_tag", "content_tag", "user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")
DEFAULT_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output", "messages": "conversations"}
DEFAULT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
HUB_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url")  # a dataset repository, downloaded (lathe.llm.hub)
REMOTE_KEYS = ("script_url", "cloud_file_name")
ENTRY_KEYS = (
    (
        "file_name",
        "formatting",
        "ranking",
        "subset",
        "split",
        "folder",
        "num_samples",
        "columns",
        "tags",
        "file_sha1",
    )
    + HUB_KEYS
    + REMOTE_KEYS
)
MEDIA_COLUMNS = ("images", "videos", "audios")  # paths relative to media_dir (lathe.llm.multimodal.media)
OFFLINE_MESSAGE = (
    "lathe does not run dataset scripts or read cloud storage; download the data and point file_name at it"
)


@dataclass
class DatasetAttr:
    """One registry entry, resolved. Column and tag fields hold the names found in the data files."""

    name: str  # the key in dataset_info.json
    file_name: str
    info_path: str  # the dataset_info.json it came from (for messages)
    formatting: str = "alpaca"
    ranking: bool = False  # preference pairs: the chosen and rejected columns hold the two answers
    split: str = "train"
    num_samples: int | None = None
    # Column names; `columns` in the registry replaces every default (LLaMA-Factory semantics).
    prompt: str | None = DEFAULT_COLUMNS["prompt"]
    query: str | None = DEFAULT_COLUMNS["query"]
    response: str | None = DEFAULT_COLUMNS["response"]
    history: str | None = None
    messages: str | None = DEFAULT_COLUMNS["messages"]
    system: str | None = None
    tools: str | None = None
    chosen: str | None = None  # ranking: the preferred answer (alpaca: text; sharegpt/openai: one message)
    rejected: str | None = None  # ranking: the other answer
    kto_tag: str | None = None  # KTO: true (desirable answer) or false (undesirable)
    images: str | None = None  # media columns: a path or a list of paths per row (relative to media_dir)
    videos: str | None = None
    audios: str | None = None
    # Role tags (sharegpt / openai); `tags` in the registry replaces every default too.
    role_tag: str | None = DEFAULT_TAGS["role_tag"]
    content_tag: str | None = DEFAULT_TAGS["content_tag"]
    user_tag: str | None = DEFAULT_TAGS["user_tag"]
    assistant_tag: str | None = DEFAULT_TAGS["assistant_tag"]
    observation_tag: str | None = DEFAULT_TAGS["observation_tag"]
    function_tag: str | None = DEFAULT_TAGS["function_tag"]
    system_tag: str | None = DEFAULT_TAGS["system_tag"]
    # Column names the entry left at their defaults: a default column absent from a file means "none"
    # (LLaMA-Factory raises KeyError there); a column the entry names explicitly must exist.
    implicit_columns: tuple[str, ...] = field(default=("prompt", "query", "response", "messages"))
    # A dataset repository on a hub (LLaMA-Factory's hf_hub_url / ms_hub_url / om_hub_url), read with its
    # subset (config name) and folder (data_dir); lathe.llm.hub.resolve_hub_datasets sets snapshot, its local copy.
    hub_urls: dict[str, str] = field(default_factory=dict)
    subset: str | None = None
    folder: str | None = None
    snapshot: str | None = None

    def where(self, key: str | None = None) -> str:
        """`dataset 'name' in path/dataset_info.json (key 'k')`, the prefix of every registry error."""
        text = f"dataset '{self.name}' in {self.info_path}"
        return f"{text} (key '{key}')" if key else text

    def column_role(self, column: str) -> str | None:
        """Which registry column (prompt, messages, ...) reads this data column name."""
        for role in COLUMN_NAMES:
            if getattr(self, role, None) == column:
                return role
        return None


def _closest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    return did_you_mean(word, choices, cutoff=0.5)


def load_dataset_info(dataset_dir: str | dict) -> tuple[dict[str, Any], str]:
    """Read the registry: returns (entries, path). `dataset_dir` may also be the registry itself (a dict)."""
    if isinstance(dataset_dir, dict):
        return dataset_dir, "<dataset_info dict>"
    if dataset_dir == "ONLINE" or dataset_dir.startswith("REMOTE:"):
        raise ValueError(
            f"dataset_dir '{dataset_dir}' reads the registry from a hub, which lathe does not do: write a local "
            f"{DATA_CONFIG} (its entries may name hf_hub_url / ms_hub_url repositories)."
        )
    path = os.path.join(dataset_dir, DATA_CONFIG)
    if not os.path.isfile(path):
        where = f"has no {DATA_CONFIG}" if os.path.isdir(dataset_dir) else f"does not exist{folder_hint(dataset_dir)}"
        raise FileNotFoundError(
            f"dataset_dir '{dataset_dir}' {where}: the registry {path} is needed to "
            f"find the datasets (LLaMA-Factory's schema)."
        )
    with open(path, encoding="utf-8") as handle:
        try:
            info = load_json(handle.read(), path)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
            ) from None
    if not isinstance(info, dict):
        raise ValueError(
            f"{path} must hold a JSON object mapping dataset names to entries, found a {type(info).__name__}"
        )
    return info, path


def get_dataset_list(names: list[str] | str | None, dataset_dir: str | dict) -> list[DatasetAttr]:
    """The registry entries for `names` (a list or a comma list), in order."""
    if names is None:
        return []
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    if not names:
        return []
    info, path = load_dataset_info(dataset_dir)
    attrs = []
    for name in names:
        if name not in info:
            registered = sorted(info)
            hint = _closest(name, registered)
            listing = ", ".join(registered[:20]) + (" ..." if len(registered) > 20 else "")
            raise ValueError(f"Undefined dataset '{name}' in {path}{hint} Registered: {listing or '(none)'}.")
        attrs.append(parse_entry(name, info[name], path))
    return attrs


def parse_entry(name: str, entry: Any, info_path: str) -> DatasetAttr:
    """One dataset_info.json entry -> DatasetAttr, validated."""
    where = f"dataset '{name}' in {info_path}"
    _check_entry_keys(entry, where)
    attr = DatasetAttr(
        name=name, file_name=entry.get("file_name", ""), info_path=info_path, ranking=entry.get("ranking", False)
    )
    attr.hub_urls = {key: entry[key] for key in HUB_KEYS if key in entry}
    attr.subset, attr.folder = entry.get("subset"), entry.get("folder")
    attr.formatting = entry.get("formatting") or "alpaca"
    if attr.formatting not in FORMATTINGS:
        raise ValueError(
            f"{where} (key 'formatting'): unknown formatting '{attr.formatting}'"
            f"{_closest(str(attr.formatting), FORMATTINGS)} Use one of: {', '.join(FORMATTINGS)}."
        )
    attr.split = entry.get("split") or "train"
    if not isinstance(attr.split, str):
        raise ValueError(f"{where} (key 'split'): must be a string such as 'train', got {attr.split!r}")
    attr.num_samples = entry.get("num_samples")
    if attr.num_samples is not None and (
        isinstance(attr.num_samples, bool) or not isinstance(attr.num_samples, int) or attr.num_samples <= 0
    ):
        raise ValueError(f"{where} (key 'num_samples'): must be a positive integer, got {attr.num_samples!r}")

    if "columns" in entry:
        _apply_names(attr, entry["columns"], COLUMN_NAMES, f"{where} (key 'columns')")
        attr.implicit_columns = ()
    if "tags" in entry:
        _apply_names(attr, entry["tags"], TAG_NAMES, f"{where} (key 'tags')")
    _check_names(attr, where)
    _check_preference_names(attr, where)
    return attr


def _check_entry_keys(entry: Any, where: str) -> None:
    """An object of known keys, read from a local file_name (no hub or script), with a usable ranking flag."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a JSON object, found a {type(entry).__name__}")
    for key in entry:
        if key not in ENTRY_KEYS:
            raise ValueError(
                f"{where}: unknown key '{key}'{_closest(key, ENTRY_KEYS)} Known keys: {', '.join(ENTRY_KEYS)}."
            )
    for key in REMOTE_KEYS:
        if key in entry:
            raise ValueError(f"{where} (key '{key}'): loads '{entry[key]}' from a script or cloud: {OFFLINE_MESSAGE}.")
    for key in HUB_KEYS:
        if key in entry and (not isinstance(entry[key], str) or not entry[key]):
            raise ValueError(f"{where} (key '{key}'): must be a repository id such as Org/Name, got {entry[key]!r}")
    has_repository = any(key in entry for key in HUB_KEYS)  # it takes file_name's place, as in LLaMA-Factory
    if not has_repository and "file_name" not in entry:
        raise ValueError(f"{where}: no 'file_name' (a file or folder relative to the dataset_dir).")
    if not has_repository and (not isinstance(entry["file_name"], str) or not entry["file_name"]):
        raise ValueError(f"{where} (key 'file_name'): must be a non-empty string, got {entry['file_name']!r}")
    if not isinstance(entry.get("ranking", False), bool):
        raise ValueError(f"{where} (key 'ranking'): must be true or false, got {entry['ranking']!r}")


def _apply_names(attr: DatasetAttr, names: Any, allowed: tuple[str, ...], where: str) -> None:
    """LLaMA-Factory semantics: a `columns` / `tags` object replaces every default; unlisted names are None."""
    if not isinstance(names, dict):
        raise ValueError(f"{where}: must be a JSON object, found a {type(names).__name__}")
    for key, value in names.items():
        if key not in allowed:
            raise ValueError(f"{where}: unknown name '{key}'{_closest(key, allowed)} Known: {', '.join(allowed)}.")
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{where}: '{key}' must be a non-empty string, got {value!r}")
    for key in allowed:
        if hasattr(attr, key):
            setattr(attr, key, names.get(key))


def _check_names(attr: DatasetAttr, where: str) -> None:
    """Catch entries that LLaMA-Factory accepts but then crashes on or drops every row of."""
    replaced = (
        "; note that `columns` replaces every default column name, so list them all"
        if not attr.implicit_columns
        else ""
    )
    if attr.formatting == "alpaca":
        if not attr.prompt and not attr.query:
            raise ValueError(f"{where} (key 'columns'): alpaca data needs a 'prompt' or 'query' column{replaced}.")
        return
    if not attr.messages:
        raise ValueError(f"{where} (key 'columns'): {attr.formatting} data needs a 'messages' column{replaced}.")
    for tag in ("role_tag", "content_tag", "user_tag", "assistant_tag"):
        if not getattr(attr, tag):
            raise ValueError(
                f"{where} (key 'tags'): '{tag}' is not set; `tags` replaces every default tag "
                f"(as in LLaMA-Factory), so list role_tag, content_tag, user_tag, assistant_tag "
                f"(and observation_tag, function_tag, system_tag where the data has them)."
            )


def _check_preference_names(attr: DatasetAttr, where: str) -> None:
    """Ranking entries name both answer columns (LLaMA-Factory crashes with KeyError: None otherwise);
    a KTO tag and a ranking pair are two different kinds of data."""
    if attr.ranking:
        missing = [column for column in ("chosen", "rejected") if not getattr(attr, column)]
        if missing:
            raise ValueError(
                f"{where} (key 'columns'): ranking data needs the {' and '.join(missing)} column"
                f"{'s' if len(missing) > 1 else ''}: name them in `columns`, e.g. "
                '{"chosen": "chosen", "rejected": "rejected"}.'
            )
        if attr.kto_tag:
            raise ValueError(
                f"{where} (key 'columns'): 'kto_tag' marks KTO data (one answer, good or bad), "
                f"which is not ranking data: remove 'ranking' or 'kto_tag'."
            )
    elif attr.chosen or attr.rejected:
        raise ValueError(
            f"{where} (key 'ranking'): the entry names chosen/rejected columns but is not marked "
            f'"ranking": true (LLaMA-Factory would ignore them).'
        )


def resolve_data_files(attr: DatasetAttr, dataset_dir: str) -> tuple[list[str], str]:
    """The files behind `file_name` (a file, or every file in a folder, sorted) and their `datasets` builder."""
    if attr.snapshot is not None:
        return hub_data_files(attr)
    if attr.hub_urls:
        raise ValueError(f"{attr.where()}: the repository was not looked up (lathe.llm.hub.resolve_hub_datasets).")
    local_path = os.path.join(dataset_dir, attr.file_name)
    if os.path.isdir(local_path):
        files = sorted(
            os.path.join(local_path, name)
            for name in os.listdir(local_path)
            if not name.startswith(".") and os.path.isfile(os.path.join(local_path, name))
        )
        if not files:
            raise ValueError(f"{attr.where('file_name')}: the folder {local_path} holds no data files.")
    elif os.path.isfile(local_path):
        files = [local_path]
    else:
        siblings = os.listdir(dataset_dir) if os.path.isdir(dataset_dir) else []
        hint = _closest(attr.file_name, siblings)
        raise FileNotFoundError(
            f"{attr.where('file_name')}: file '{attr.file_name}' not found "
            f"(looked for {os.path.abspath(local_path)}){hint}"
        )
    kinds = {}
    for path in files:
        extension = os.path.splitext(path)[1][1:].lower()
        if extension not in FILE_TYPES:
            raise ValueError(
                f"{attr.where('file_name')}: {path} has an unsupported file type '.{extension}'; "
                f"allowed: {', '.join('.' + ext for ext in FILE_TYPES)}."
            )
        kinds.setdefault(FILE_TYPES[extension], []).append(os.path.basename(path))
    if len(kinds) > 1:
        listing = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in kinds.items())
        raise ValueError(
            f"{attr.where('file_name')}: the folder {local_path} mixes file types ({listing}); "
            f"a dataset's files must share one type."
        )
    return files, next(iter(kinds))


def hub_data_files(attr: DatasetAttr) -> tuple[list[str], str]:
    """The files of a downloaded dataset repository for the entry's subset, folder and split, found as
    `datasets.load_dataset(repo, name=subset, data_dir=folder, split=split)` finds them (its README's configs,
    else its file-name patterns), and their builder."""
    import datasets

    try:
        builder = datasets.load_dataset_builder(attr.snapshot, name=attr.subset, data_dir=attr.folder)
    except (ValueError, FileNotFoundError) as error:
        raise ValueError(f"{attr.where()}: the repository's files cannot be read: {error}".splitlines()[0]) from None
    data_files = builder.config.data_files or {}
    if attr.split not in data_files:
        raise ValueError(
            f"{attr.where('split')}: the repository has no split '{attr.split}'; it has: {', '.join(data_files) or 'none'}."
        )
    if builder.name not in FILE_TYPES.values():
        raise ValueError(
            f"{attr.where()}: the repository's data is read by {builder.name!r}, which lathe does not read."
        )
    return sorted(str(path) for path in data_files[attr.split]), builder.name
