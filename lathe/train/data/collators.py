"""Collators: turn a list of dataset items into one batch of PyTorch tensors (or NumPy arrays), as transformers' do."""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import torch

from lathe.train.data.collator_base import DataCollatorMixin, check_return_tensors, convert_batch
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.data.masking import DataCollatorForLanguageModeling
from lathe.train.data.padding import (
    as_list,
    get_padding_side,
    normalize_padding,
    pad_batch,
    pad_sequence,
    round_up,
    to_tensor,
)

__all__ = [
    "DataCollatorForLanguageModeling",
    "DataCollatorForSeq2Seq",
    "DataCollatorWithFlattening",
    "DataCollatorWithPadding",
    "DefaultDataCollator",
    "default_data_collator",
    "numpy_default_data_collator",
    "torch_default_data_collator",
]

_NUMBER_TYPES = (bool, int, float, np.number)


# ---------------------------------------------------------------------------- default collation


def default_data_collator(features: list, return_tensors: str = "pt"):
    """Batch dict items (or objects, through `vars`) field by field, or tuple items position by position.

    `label` (one value per item) and `label_ids` (a list per item) become `labels`; None and string
    fields are left out. Tuples of tensors give a tuple of stacked tensors, for `model(*batch)`.
    """
    check_return_tensors(return_tensors)
    if len(features) == 0:
        raise ValueError("default_data_collator got an empty batch.")
    first = features[0]
    if isinstance(first, Mapping):
        return _collate_dicts(features) if return_tensors == "pt" else _collate_dicts_numpy(features)
    if isinstance(first, (tuple, list)) and _is_tuple_of_tensors(first):
        return convert_batch(_collate_positions(features), return_tensors)
    if hasattr(first, "__dict__") and not isinstance(first, (torch.Tensor, np.ndarray, tuple, list)):
        return default_data_collator([vars(feature) for feature in features], return_tensors)
    hint = ""
    if isinstance(first, (tuple, list)) and all(isinstance(value, _NUMBER_TYPES) for value in first):
        hint = " A list of numbers reads as one token sequence: return {'input_ids': [...]} instead."
    raise TypeError(
        f"default_data_collator cannot batch a dataset item of type {type(first).__name__} "
        f"({reprlib.repr(first)}). Each item must be a dict of fields, e.g. {{'input_ids': [...], "
        f"'labels': ...}}, or a tuple of tensors, e.g. (inputs, target).{hint}"
    )


def default_collator_for(processing_class):
    """The Trainer's collator when none is given: padding with a tokenizer that has a pad token, else
    default_data_collator (as transformers chooses)."""
    if (
        processing_class is not None
        and hasattr(processing_class, "pad")
        and getattr(processing_class, "pad_token_id", None) is not None
    ):
        return DataCollatorWithPadding(processing_class)
    return default_data_collator


def _is_tuple_of_tensors(item) -> bool:
    # A list of plain numbers is far more likely one token sequence than a tuple of scalar
    # fields, so at least one tensor or array is required before batching position by position.
    return (
        len(item) > 0
        and all(isinstance(value, (torch.Tensor, np.ndarray, *_NUMBER_TYPES)) for value in item)
        and any(isinstance(value, (torch.Tensor, np.ndarray)) for value in item)
    )


def _collate_positions(features) -> tuple:
    width = len(features[0])
    if any(not isinstance(feature, (tuple, list)) or len(feature) != width for feature in features):
        raise ValueError(f"Every tuple dataset item in a batch must have {width} elements, like the first one.")
    return tuple(to_tensor(f"position {index}", list(column)) for index, column in enumerate(zip(*features)))


def _collate_dicts(features) -> dict:
    first = features[0]
    batch = {}
    # transformers picks the label dtype from the first item: ints give long (classification),
    # anything else float (regression, multi-label lists), so a loss gets the dtype it needs.
    if first.get("label") is not None:
        label = first["label"]
        if isinstance(label, torch.Tensor) and label.numel() > 1:
            dtype = torch.float if label.is_floating_point() else torch.long
        else:
            label = label.item() if isinstance(label, torch.Tensor) else label
            dtype = torch.long if isinstance(label, (int, np.integer)) else torch.float
        batch["labels"] = to_tensor("label", [feature["label"] for feature in features], dtype)
    elif first.get("label_ids") is not None:
        label_ids = first["label_ids"]
        dtype = None
        if not isinstance(label_ids, torch.Tensor):
            dtype = torch.long if isinstance(label_ids[0], (int, np.integer)) else torch.float
        batch["labels"] = to_tensor("label_ids", [feature["label_ids"] for feature in features], dtype)
    for key, value in first.items():
        if key in ("label", "label_ids") or value is None or isinstance(value, str):
            continue
        batch[key] = to_tensor(key, list(map(itemgetter(key), features)))
    return batch


def torch_default_data_collator(features: list) -> dict:
    """`default_data_collator` with PyTorch tensors."""
    return default_data_collator(features, "pt")


def numpy_default_data_collator(features: list) -> dict:
    """`default_data_collator` with NumPy arrays."""
    return default_data_collator(features, "np")


def _collate_dicts_numpy(features) -> dict:
    # transformers' NumPy rules: int labels int64, others float32; other fields as np.array makes them
    first = features[0]
    batch = {}
    for name in ("label", "label_ids"):
        if first.get(name) is None:
            continue
        values = [feature[name] for feature in features]
        if isinstance(first[name], np.ndarray) and name == "label_ids":
            batch["labels"] = np.stack(values)
        else:
            sample = first[name] if name == "label" else first[name][0]
            sample = sample.item() if isinstance(sample, np.ndarray) else sample
            dtype = np.int64 if isinstance(sample, (int, np.integer)) else np.float32
            batch["labels"] = np.array(values, dtype=dtype)
        break
    for key, value in first.items():
        if key in ("label", "label_ids") or value is None or isinstance(value, str):
            continue
        values = [feature[key] for feature in features]
        try:
            batch[key] = np.stack(values) if isinstance(value, np.ndarray) else np.array(values)
        except ValueError as error:
            raise ValueError(f"Cannot batch field {key!r} into one array ({error}); pad it first.") from error
    return batch


@dataclass
class DefaultDataCollator(DataCollatorMixin):
    """`default_data_collator` as an object, so `return_tensors` can be set once."""

    return_tensors: str = "pt"

    def __post_init__(self):
        check_return_tensors(self.return_tensors)

    def torch_call(self, features: list):
        return default_data_collator(features, "pt")

    def numpy_call(self, features: list):
        return default_data_collator(features, "np")


# ---------------------------------------------------------------------------- padding collators


@dataclass
class DataCollatorWithPadding:
    """Pad every tokenized field to the longest item (or `max_length`); `label`/`label_ids` become `labels`."""

    tokenizer: Any
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self):
        check_return_tensors(self.return_tensors)
        normalize_padding(self.padding)

    def __call__(self, features: list) -> dict:
        check_return_tensors(self.return_tensors)
        batch = pad_batch(self.tokenizer, features, self.padding, self.max_length, self.pad_to_multiple_of)
        for name in ("label", "label_ids"):
            if name in batch:
                batch["labels"] = batch.pop(name)
        return convert_batch(batch, self.return_tensors)


@dataclass
class DataCollatorForSeq2Seq:
    """Pad inputs with the tokenizer and `labels` with `label_pad_token_id` (ignored by the loss), on the
    tokenizer's padding side; with a `model`, also build `decoder_input_ids` from the padded labels."""

    tokenizer: Any
    model: Any | None = None
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = IGNORE_INDEX
    return_tensors: str = "pt"

    def __post_init__(self):
        check_return_tensors(self.return_tensors)
        normalize_padding(self.padding)

    def __call__(self, features: list, return_tensors: str | None = None) -> dict:
        return_tensors = return_tensors or self.return_tensors
        check_return_tensors(return_tensors)
        label_name = "label" if "label" in features[0] else "labels"
        labels = [feature[label_name] for feature in features] if label_name in features[0] else None
        if labels is not None and all(label is None for label in labels):
            labels = None
        # labels are padded here, not by the tokenizer: their pad value is label_pad_token_id, not pad_token_id
        inputs = [{key: value for key, value in feature.items() if key != label_name} for feature in features]
        batch = pad_batch(self.tokenizer, inputs, self.padding, self.max_length, self.pad_to_multiple_of)
        if labels is None:
            batch["labels"] = None  # transformers keeps the key; models treat labels=None as "no loss"
            return convert_batch(batch, return_tensors)
        labels = [as_list(label) for label in labels]
        strategy = normalize_padding(self.padding)
        if strategy != "do_not_pad":
            if strategy == "max_length" and self.max_length is not None:
                target = self.max_length
            else:
                target = max(len(label) for label in labels)
            target = round_up(target, self.pad_to_multiple_of)
            side = get_padding_side(self.tokenizer)
            labels = [pad_sequence(label, target - len(label), self.label_pad_token_id, side) for label in labels]
        batch["labels"] = to_tensor("labels", labels, torch.int64)
        if self.model is not None and hasattr(self.model, "prepare_decoder_input_ids_from_labels"):
            batch["decoder_input_ids"] = self.model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
        return convert_batch(batch, return_tensors)


# ---------------------------------------------------------------------------- padding-free packing


class DataCollatorWithFlattening(DefaultDataCollator):
    """Pack the whole batch into one row with no padding: `input_ids`, `labels` and `position_ids`
    of shape (1, total tokens), positions restarting at each example so attention kernels that
    read them (or `cu_seq_lens_*` / `seq_idx`) keep the examples apart."""

    def __init__(
        self,
        *args,
        return_position_ids=True,
        separator_id=IGNORE_INDEX,
        return_flash_attn_kwargs=False,
        return_seq_idx=False,
        position_ids_start=0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.return_position_ids = return_position_ids
        self.separator_id = separator_id
        self.return_flash_attn_kwargs = return_flash_attn_kwargs
        self.return_seq_idx = return_seq_idx
        self.position_ids_start = position_ids_start

    def __call__(self, features: list, return_tensors: str | None = None, separator_id: int | None = None) -> dict:
        return_tensors = return_tensors or self.return_tensors
        check_return_tensors(return_tensors)
        separator_id = self.separator_id if separator_id is None else separator_id
        has_labels = "labels" in features[0]
        input_ids, labels, position_ids, seq_idx, lengths = [], [], [], [], []
        for index, feature in enumerate(features):
            ids = as_list(feature["input_ids"])
            own_labels = as_list(feature["labels"]) if has_labels else ids
            input_ids += ids
            # The model shifts labels left by one, so an example's first label would be predicted
            # from the previous example's last token: the separator keeps that out of the loss.
            labels += [separator_id] + own_labels[1:]
            position_ids += range(self.position_ids_start, self.position_ids_start + len(ids))
            seq_idx += [index] * len(ids)
            lengths.append(len(ids))

        batch = {
            "input_ids": torch.tensor([input_ids], dtype=torch.int64),
            "labels": torch.tensor([labels], dtype=torch.int64),
        }
        if self.return_position_ids:
            batch["position_ids"] = torch.tensor([position_ids], dtype=torch.int64)
        # attention kernels expect int32 for sequence indices and boundaries, python ints for max lengths
        if self.return_seq_idx:
            batch["seq_idx"] = torch.tensor([seq_idx], dtype=torch.int32)
        if self.return_flash_attn_kwargs:
            boundaries = np.cumsum([0, *lengths]).tolist()
            batch["cu_seq_lens_q"] = torch.tensor(boundaries, dtype=torch.int32)
            batch["cu_seq_lens_k"] = torch.tensor(boundaries, dtype=torch.int32)
            batch["max_length_q"] = batch["max_length_k"] = max(lengths)
        return convert_batch(batch, return_tensors)
