"""Collators for token classification (labels padded beside the inputs) and multiple choice (every
choice of every example padded to one length), as transformers' are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lathe.train.data.collator_base import DataCollatorMixin, check_return_tensors
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.data.padding import as_list, get_padding_side, normalize_padding, pad_batch, pad_sequence

__all__ = ["DataCollatorForMultipleChoice", "DataCollatorForTokenClassification"]


@dataclass
class DataCollatorForTokenClassification(DataCollatorMixin):
    """Pad the inputs with the tokenizer and the per-token labels (`labels`, or `label`, which keeps its
    name) to the same length with `label_pad_token_id` (-100: ignored by the loss), on the tokenizer's
    padding side. Items without labels give a batch without labels."""

    tokenizer: Any
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = IGNORE_INDEX
    return_tensors: str = "pt"

    def __post_init__(self):
        check_return_tensors(self.return_tensors)
        normalize_padding(self.padding)

    def torch_call(self, features: list) -> dict:
        label_name = "label" if "label" in features[0] else "labels"
        labels = [feature[label_name] for feature in features] if label_name in features[0] else None
        inputs = [{key: value for key, value in feature.items() if key != label_name} for feature in features]
        batch = pad_batch(self.tokenizer, inputs, self.padding, self.max_length, self.pad_to_multiple_of)
        if labels is None:
            return batch
        length = batch["input_ids"].shape[1]
        side = get_padding_side(self.tokenizer)
        rows = [as_list(label) for label in labels]
        if any(len(row) > length for row in rows):
            raise ValueError(
                f"A {label_name!r} row is longer ({max(len(row) for row in rows)}) than its padded input_ids "
                f"({length}): give one label per token."
            )
        padded = [pad_sequence(row, length - len(row), self.label_pad_token_id, side) for row in rows]
        batch[label_name] = torch.tensor(padded, dtype=torch.int64)
        return batch


@dataclass
class DataCollatorForMultipleChoice(DataCollatorMixin):
    """Items hold one sequence per choice (`input_ids`: a list of C lists) and one `label` (or `labels`):
    every choice of every item is padded to one length, giving (batch, C, length) tensors and int64 labels."""

    tokenizer: Any
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self):
        check_return_tensors(self.return_tensors)
        normalize_padding(self.padding)

    def torch_call(self, examples: list) -> dict:
        label_name = "label" if "label" in examples[0] else "labels"
        if label_name not in examples[0]:
            raise ValueError("DataCollatorForMultipleChoice needs a 'label' or 'labels' field in every item.")
        labels = [example[label_name] for example in examples]
        choices = len(examples[0]["input_ids"])
        for index, example in enumerate(examples):
            if len(example["input_ids"]) != choices:
                raise ValueError(
                    f"Item {index} has {len(example['input_ids'])} choices, item 0 has {choices}: every item "
                    "needs the same number of choices."
                )
        flat = [
            {key: as_list(value)[choice] for key, value in example.items() if key != label_name}
            for example in examples
            for choice in range(choices)
        ]
        batch = pad_batch(self.tokenizer, flat, self.padding, self.max_length, self.pad_to_multiple_of)
        batch = {key: value.view(len(examples), choices, -1) for key, value in batch.items()}
        batch["labels"] = torch.tensor(labels, dtype=torch.int64)
        return batch
