"""Model weights as safetensors files in a folder: the single file or the sharded layout (an index and the
shards it lists), and whether a layout's files are all there at their full length (read from their headers)."""

from __future__ import annotations

import json
import os
import re

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
_SHARD_NAME = re.compile(r"model-\d+-of-\d+\.safetensors")


def is_model_weights_file(name: str) -> bool:
    """model.safetensors, its index, or a shard named as transformers names them."""
    return name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME) or bool(_SHARD_NAME.fullmatch(name))


def complete_layout(folder: str) -> str | None:
    """The weights layout `folder` holds complete: WEIGHTS_NAME, else WEIGHTS_INDEX_NAME (every shard it
    lists complete), else None."""
    for name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME):
        if os.path.isfile(os.path.join(folder, name)) and files_complete(folder, name):
            return name
    return None


def files_complete(folder: str, name: str) -> bool:
    """Whether the file `name` (for an index: every shard it lists) is complete; files other than
    safetensors count as complete."""
    if name == WEIGHTS_INDEX_NAME:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                shards = set(json.load(f)["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            return False
        return bool(shards) and all(
            isinstance(shard, str) and file_complete(os.path.join(folder, shard)) for shard in shards
        )
    return not name.endswith(".safetensors") or file_complete(os.path.join(folder, name))


def file_complete(path: str) -> bool:
    """Reads only the header: 8 bytes of header length, a JSON header whose data offsets say how
    long the file must be."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header_length = int.from_bytes(f.read(8), "little")
            if size < 8 + header_length:
                return False
            header = json.loads(f.read(header_length))
        data_end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
        return size >= 8 + header_length + data_end
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False
