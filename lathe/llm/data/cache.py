"""The tokenization cache: processed datasets stored under a key that hashes everything they depend on.

The key covers the content of the data files (and their registry entries), the tokenizer (its files
and its in-memory state, which templates may change), the template (every field), every argument that
changes the result, and the source of the code that produces it. Entries are written into a
temporary folder and renamed into place in one step, so a crash mid-way leaves only a temporary folder
that is never read. `tokenized_path` (LLaMA-Factory semantics: load when it exists, else save there)
is written the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Iterator

logger = logging.getLogger("lathe.llm.data")

CACHE_FORMAT = 1
MANIFEST = "lathe_cache.json"
STALE_TEMPORARY_SECONDS = 24 * 3600
# Data arguments that cannot change the processed rows: where things live, how fast they are made.
NEUTRAL_DATA_ARGUMENTS = {
    "overwrite_cache",
    "preprocessing_num_workers",
    "tokenized_path",
    "max_dropped_rows_share",  # checked after tokenizing: it changes no row
    "dataset_dir",
    "eval_num_beams",
    "media_dir",  # in the key only for data with media columns (pipeline.DataPlan.key_parts)
    "data_shared_file_system",
}
TOKENIZER_FILES = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.jinja",
    "chat_template.json",
}
READ_CHUNK = 1 << 20


def hash_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(READ_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hash_text(text: str | bytes) -> str:
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


def stable_structure(value: Any, _seen: set | None = None) -> Any:
    """A JSON-able description of `value` with no memory addresses, so that equal configurations hash
    equal across processes: dataclasses and plain objects by class and fields, callables by name."""
    seen = set() if _seen is None else _seen
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return hash_text(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, type) or _is_function(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    if hasattr(value, "convert_tokens_to_ids"):  # a tokenizer inside a template: hashed on its own
        return "<tokenizer>"
    if id(value) in seen:
        return "<cycle>"
    seen = seen | {id(value)}
    if isinstance(value, dict):
        return {
            str(key): stable_structure(item, seen) for key, item in sorted(value.items(), key=lambda kv: str(kv[0]))
        }
    if isinstance(value, (list, tuple)):
        return [stable_structure(item, seen) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((stable_structure(item, seen) for item in value), key=lambda item: json.dumps(item, default=str))
    if dataclasses.is_dataclass(value):
        fields = {field.name: stable_structure(getattr(value, field.name), seen) for field in dataclasses.fields(value)}
        return {"__class__": type(value).__qualname__, **fields}
    if hasattr(value, "__dict__"):
        fields = {
            key: stable_structure(item, seen) for key, item in sorted(vars(value).items()) if not key.startswith("__")
        }
        return {"__class__": type(value).__qualname__, **fields}
    return f"<{type(value).__qualname__}>"


def _is_function(value: Any) -> bool:
    import types

    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType))


def describe_tokenizer(tokenizer) -> dict[str, Any]:
    """What makes two tokenizers encode the same: the files in its folder and its in-memory state
    (a template may have changed EOS or added tokens since the files were read)."""
    state: dict[str, Any] = {"class": type(tokenizer).__name__}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state["backend"] = hash_text(backend.to_str())
    else:
        state["vocab"] = hash_text(json.dumps(sorted(tokenizer.get_vocab().items())))
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    state["added_tokens"] = {str(index): str(token) for index, token in sorted(decoder.items())}
    state["special_tokens"] = stable_structure(getattr(tokenizer, "special_tokens_map", {}))
    for name in (
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "unk_token_id",
        "chat_template",
        "padding_side",
        "truncation_side",
        "add_bos_token",
        "add_eos_token",
        "split_special_tokens",
        "clean_up_tokenization_spaces",
        "model_max_length",
    ):
        state[name] = stable_structure(getattr(tokenizer, name, None))
    folder = getattr(tokenizer, "name_or_path", "") or ""
    if os.path.isdir(folder):
        state["files"] = {
            name: hash_file(os.path.join(folder, name))
            for name in sorted(os.listdir(folder))
            if name in TOKENIZER_FILES or name.startswith("tokenizer") or name.endswith(".tiktoken")
        }
    return state


def describe_data_args(data_args: Any, packing: bool) -> dict[str, Any]:
    """Every data argument except the ones that cannot change the rows (NEUTRAL_DATA_ARGUMENTS)."""
    values = (
        {field.name: getattr(data_args, field.name) for field in dataclasses.fields(data_args)}
        if dataclasses.is_dataclass(data_args)
        else dict(vars(data_args))
    )
    values = {
        key: value for key, value in values.items() if key not in NEUTRAL_DATA_ARGUMENTS and not key.startswith("_")
    }
    values["packing"] = packing  # resolved: None means "true for pt", which the stage already decides
    return stable_structure(values)


def source_digest(paths: list[str]) -> str:
    """The code that makes the rows: a fixed bug must not keep serving rows cached before the fix."""
    digest = hashlib.sha256()
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for path in sorted(set(os.path.abspath(path) for path in paths)):
        digest.update(os.path.relpath(path, package_parent).encode())  # the same install elsewhere hashes equal
        digest.update(hash_file(path).encode())
    return digest.hexdigest()


def cache_key(parts: dict[str, Any]) -> str:
    text = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


def entry_path(root: str, key: str) -> str:
    return os.path.join(root, key)


def read_manifest(folder: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def load_entry(root: str, key: str):
    """(splits as {name: Dataset}, manifest) for a complete entry, or None. An unreadable entry is a miss."""
    folder = entry_path(root, key)
    manifest = read_manifest(folder)
    if manifest is None or manifest.get("key") != key:
        return None
    try:
        return load_splits(folder, manifest), manifest
    except Exception as error:  # a damaged entry (disk full, files removed by hand): rebuild it
        logger.warning("tokenization cache entry %s is unreadable (%s): re-tokenizing", folder, error)
        return None


def load_splits(folder: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The entry's splits as the Trainer gets them (the per-row truncation counts left out)."""
    import datasets

    from lathe.llm.data.truncation import without_columns

    splits = {}
    for name, files in manifest["splits"].items():
        parts = [datasets.Dataset.from_file(os.path.join(folder, file)) for file in files]
        splits[name] = without_columns(parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts))
    return splits


@contextlib.contextmanager
def staging_folder(root: str, key: str) -> Iterator[str]:
    """A temporary folder inside `root` that becomes `root/key` when the body finishes (one rename), or
    disappears when it raises. The body must write the manifest last."""
    os.makedirs(root, exist_ok=True)
    _remove_stale_temporaries(root)
    staging = tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-{os.getpid()}-", dir=root)
    try:
        yield staging
        if read_manifest(staging) is None:
            raise RuntimeError(f"cache staging folder {staging} has no {MANIFEST}: refusing to publish it")
        replace_folder(staging, entry_path(root, key))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_folder(source: str, target: str) -> None:
    """Move `source` to `target` by rename; an existing `target` is moved aside first, then removed."""
    if os.path.exists(target):
        aside = tempfile.mkdtemp(prefix=".old-", dir=os.path.dirname(target))
        os.rename(target, os.path.join(aside, "entry"))
        os.rename(source, target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(source, target)


def _remove_stale_temporaries(root: str) -> None:
    """Staging folders left by crashed runs are never read; remove them once they are a day old."""
    now = time.time()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith((".tmp-", ".old-")) and now - os.path.getmtime(path) > STALE_TEMPORARY_SECONDS:
            shutil.rmtree(path, ignore_errors=True)


def write_manifest(folder: str, manifest: dict[str, Any]) -> None:
    path = os.path.join(folder, MANIFEST)
    with open(path + ".partial", "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True, default=str)
    os.replace(path + ".partial", path)


def has_tokenized_data(path: str) -> bool:
    """LLaMA-Factory's test: a non-empty folder."""
    return os.path.isdir(path) and len(os.listdir(path)) > 0


def load_tokenized_path(path: str) -> dict[str, Any]:
    """{split: Dataset} from a folder written by `save_tokenized_path` or LLaMA-Factory."""
    import datasets

    if not (
        os.path.isfile(os.path.join(path, "dataset_dict.json"))
        or os.path.isfile(os.path.join(path, "dataset_info.json"))
    ):
        raise ValueError(
            f"tokenized_path {path} exists but holds no saved dataset (no dataset_dict.json): "
            f"remove it to tokenize again, or point tokenized_path at a saved dataset."
        )
    loaded = datasets.load_from_disk(path)
    return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}


def save_tokenized_path(
    splits: dict[str, Any], path: str, key: str | None, stats: dict[str, Any] | None = None
) -> None:
    """DatasetDict.save_to_disk into a sibling temporary folder, then one rename (LLaMA-Factory writes in
    place: a crash leaves a half-written folder that the next run loads)."""
    import datasets

    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        target = os.path.join(staging, "data")
        datasets.DatasetDict(splits).save_to_disk(target)
        write_manifest(target, {"key": key, "splits": None, "written": time.time(), "stats": stats})
        replace_folder(target, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
