"""`lathe data preview CONFIG --dump FILE`: every training example and what the training collator makes of
it, written as one safetensors file, so two implementations (lathe, LLaMA-Factory) can be compared tensor for
tensor on the same data.

Keys (tensors):
- `example.<i>.<column>` for input_ids, labels, attention_mask (int64; dataset order, after cutoff),
- `single.<i>.<key>`: every tensor the collator returns for example i alone,
- `pair.<b>.<key>`: the same for the pair of examples [2b, 2b+1] (a last odd example has no pair).
A collator that nests its tensors (MiniCPM-V's `data` dict of per-row lists) gives a key per tensor, its path joined
by dots (`single.0.data.pixel_values.0.1`). In `__metadata__` (strings): any other value the collator returns as
JSON under `json.<single|pair>.<n>.<key>` (an empty list included), and a collator error as its message under
`error.<single|pair>.<n>`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

EXAMPLE_COLUMNS = ("input_ids", "labels", "attention_mask")


def _add_batch(tensors: dict, metadata: dict, prefix: str, batch: dict[str, Any]) -> None:
    for key, value in batch.items():
        _add_value(tensors, metadata, f"{prefix}.{key}", value)


def _holds_tensors(value) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensors(item) for item in value.values())
    return isinstance(value, (list, tuple)) and any(_holds_tensors(item) for item in value)


def _add_value(tensors: dict, metadata: dict, name: str, value) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        # safetensors refuses tensors that share memory or are not contiguous
        tensors[name] = value.detach().to("cpu").contiguous().clone()
    elif isinstance(value, Mapping) and _holds_tensors(value):
        for key, item in value.items():
            _add_value(tensors, metadata, f"{name}.{key}", item)
    elif isinstance(value, (list, tuple)) and _holds_tensors(value):
        for index, item in enumerate(value):
            _add_value(tensors, metadata, f"{name}.{index}", item)
    else:
        metadata[f"json.{name}"] = json.dumps(value, default=str)


def _collate(collator, features: list[dict], tensors: dict, metadata: dict, prefix: str) -> None:
    try:
        batch = collator([dict(feature) for feature in features])
    except Exception as error:  # the error is part of what is compared: keep it and go on
        metadata[f"error.{prefix}"] = f"{type(error).__name__}: {error}"
        return
    _add_batch(tensors, metadata, prefix, dict(batch))


def dump_examples(dataset, collator, path: str) -> dict[str, int]:
    """Write the examples of `dataset` and the collator's tensors for each one and each pair to `path`.

    Returns counts of what was written (examples, pairs, collator errors)."""
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {}
    rows = [dict(dataset[index]) for index in range(len(dataset))]
    for index, row in enumerate(rows):
        for column in EXAMPLE_COLUMNS:
            if row.get(column) is not None:
                tensors[f"example.{index}.{column}"] = torch.tensor(row[column], dtype=torch.int64)
        _collate(collator, [row], tensors, metadata, f"single.{index}")
    for pair in range(len(rows) // 2):
        _collate(collator, rows[2 * pair : 2 * pair + 2], tensors, metadata, f"pair.{pair}")
    save_file(tensors, path, metadata=metadata)
    errors = sum(key.startswith("error.") for key in metadata)
    return {"examples": len(rows), "pairs": len(rows) // 2, "errors": errors}
