"""Model folders that cannot give the model they claim: a damaged (truncated) safetensors file, a config.json
that does not match the weights (tensors missing or unexpected: transformers would initialise them at random
and only warn), a folder without a tokenizer. Each is one error naming the file or folder."""

from __future__ import annotations

import json
import os
import struct

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tiktoken.model",
)
SHOWN = 3  # tensor names quoted per list


def safetensors_problem(path: str) -> str | None:
    """Why `path` is not a whole safetensors file (header unreadable, data shorter than the header says), or
    None. Reads the header only."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                return f"{size} bytes: too short for a safetensors header"
            (length,) = struct.unpack("<Q", prefix)
            if length > size - 8:
                return f"truncated: its header says {length} bytes of header, the file has {size}"
            header = json.loads(f.read(length))
    except (OSError, ValueError, UnicodeDecodeError) as error:
        return f"unreadable header ({error})"
    end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    if 8 + length + end > size:
        return f"truncated: {size} bytes, its header describes {8 + length + end}"
    return None


def check_weight_files(folder: str) -> None:
    """ValueError naming the first damaged *.safetensors file in a local model folder."""
    if not os.path.isdir(folder):
        return
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            problem = safetensors_problem(os.path.join(folder, name))
            if problem is not None:
                raise ValueError(
                    f"weight file {os.path.join(folder, name)} is damaged ({problem}): download or copy it again."
                )


def _weights_named(folder: str) -> str:
    names = sorted(name for name in os.listdir(folder) if name.endswith((".safetensors", ".bin", ".index.json")))
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "") if names else "its weights"


def _some(keys) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:SHOWN]) + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")


def check_loading_info(info: dict, folder: str) -> None:
    """from_pretrained's loading info: tensors missing from the weights or not in the model are an error
    naming config.json and the weight files (never a silent random initialisation)."""
    missing, unexpected = list(info.get("missing_keys") or ()), list(info.get("unexpected_keys") or ())
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} tensors the config needs are not in the weights ({_some(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} tensors in the weights have no place in the model ({_some(unexpected)})")
    raise ValueError(
        f"{os.path.join(folder, 'config.json')} does not match the weights in {folder} ({_weights_named(folder)}): "
        f"{'; '.join(parts)}. Loading would "
        + ("initialise the missing ones at random" if missing else "drop the extra ones")
        + ": fix config.json or the weights."
    )


def mismatch_error(error: Exception, folder: str) -> ValueError | None:
    """transformers' "ignore_mismatched_sizes" RuntimeError (tensor shapes differ from config.json's), named."""
    if "ignore_mismatched_sizes" not in str(error):
        return None
    return ValueError(
        f"{os.path.join(folder, 'config.json')} does not match the weights in {folder} ({_weights_named(folder)}): "
        "some tensors have other shapes than the config gives (see transformers' load report above)."
    )


def check_has_tokenizer(folder: str) -> None:
    """FileNotFoundError when a local model folder holds no tokenizer file at all."""
    if os.path.isdir(folder) and not any(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"model folder {folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES[:4])}, ...): copy the "
            "tokenizer files of the model it came from into it."
        )
