"""Collators: turn a list of dataset items into one batch of PyTorch tensors, as transformers' do."""
from __future__ import annotations

import reprlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import torch

from lathe.train.padding import (
    as_list,
    get_padding_side,
    normalize_padding,
    pad_batch,
    pad_sequence,
    round_up,
    stack_or_pad_sequences,
    to_tensor,
)

__all__ = [
    "DataCollatorForLanguageModeling",
    "DataCollatorForSeq2Seq",
    "DataCollatorWithFlattening",
    "DataCollatorWithPadding",
    "DefaultDataCollator",
    "default_data_collator",
]

_NUMBER_TYPES = (bool, int, float, np.number)


def _check_return_tensors(return_tensors) -> None:
    if return_tensors != "pt":
        raise ValueError(
            f"lathe collators return PyTorch tensors only: return_tensors must be 'pt', got {return_tensors!r}."
        )


# ---------------------------------------------------------------------------- default collation


def default_data_collator(features: list, return_tensors: str = "pt"):
    """Batch dict items (or objects, through `vars`) field by field, or tuple items position by position.

    `label` (one value per item) and `label_ids` (a list per item) become `labels`; None and string
    fields are left out. Tuples of tensors give a tuple of stacked tensors, for `model(*batch)`.
    """
    _check_return_tensors(return_tensors)
    if len(features) == 0:
        raise ValueError("default_data_collator got an empty batch.")
    first = features[0]
    if isinstance(first, Mapping):
        return _collate_dicts(features)
    if isinstance(first, (tuple, list)) and _is_tuple_of_tensors(first):
        return _collate_positions(features)
    if hasattr(first, "__dict__") and not isinstance(first, (torch.Tensor, np.ndarray, tuple, list)):
        return _collate_dicts([vars(feature) for feature in features])
    hint = ""
    if isinstance(first, (tuple, list)) and all(isinstance(value, _NUMBER_TYPES) for value in first):
        hint = " A list of numbers reads as one token sequence: return {'input_ids': [...]} instead."
    raise TypeError(
        f"default_data_collator cannot batch a dataset item of type {type(first).__name__} "
        f"({reprlib.repr(first)}). Each item must be a dict of fields, e.g. {{'input_ids': [...], "
        f"'labels': ...}}, or a tuple of tensors, e.g. (inputs, target).{hint}"
    )


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


@dataclass
class DefaultDataCollator:
    """`default_data_collator` as an object, so `return_tensors` can be set once."""

    return_tensors: str = "pt"

    def __post_init__(self):
        _check_return_tensors(self.return_tensors)

    def __call__(self, features: list, return_tensors: str | None = None):
        return default_data_collator(features, return_tensors or self.return_tensors)


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
        _check_return_tensors(self.return_tensors)
        normalize_padding(self.padding)

    def __call__(self, features: list) -> dict:
        _check_return_tensors(self.return_tensors)
        batch = pad_batch(self.tokenizer, features, self.padding, self.max_length, self.pad_to_multiple_of)
        for name in ("label", "label_ids"):
            if name in batch:
                batch["labels"] = batch.pop(name)
        return batch


@dataclass
class DataCollatorForSeq2Seq:
    """Pad inputs with the tokenizer and `labels` with `label_pad_token_id` (ignored by the loss), on the
    tokenizer's padding side; with a `model`, also build `decoder_input_ids` from the padded labels."""

    tokenizer: Any
    model: Any | None = None
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = -100
    return_tensors: str = "pt"

    def __post_init__(self):
        _check_return_tensors(self.return_tensors)
        normalize_padding(self.padding)

    def __call__(self, features: list, return_tensors: str | None = None) -> dict:
        _check_return_tensors(return_tensors or self.return_tensors)
        label_name = "label" if "label" in features[0] else "labels"
        labels = [feature[label_name] for feature in features] if label_name in features[0] else None
        if labels is not None and all(label is None for label in labels):
            labels = None
        # labels are padded here, not by the tokenizer: their pad value is label_pad_token_id, not pad_token_id
        inputs = [{key: value for key, value in feature.items() if key != label_name} for feature in features]
        batch = pad_batch(self.tokenizer, inputs, self.padding, self.max_length, self.pad_to_multiple_of)
        if labels is None:
            batch["labels"] = None  # transformers keeps the key; models treat labels=None as "no loss"
            return batch
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
        return batch


# ---------------------------------------------------------------------------- language modeling


def _special_tokens_mask(tokenizer, token_ids: list) -> list:
    """1 where a token must never be masked: the tokenizer's own rule, else its special-token ids."""
    if hasattr(tokenizer, "get_special_tokens_mask"):
        return tokenizer.get_special_tokens_mask(token_ids, already_has_special_tokens=True)
    special_ids = getattr(tokenizer, "all_special_ids", None)
    if special_ids is None:
        names = ("pad", "bos", "eos", "unk", "sep", "cls", "mask")
        special_ids = [getattr(tokenizer, f"{name}_token_id", None) for name in names]
    special_ids = {token_id for token_id in special_ids if token_id is not None}
    return [1 if token_id in special_ids else 0 for token_id in token_ids]


def _word_ids_and_unmaskable(offset_mapping, special_tokens_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Number the words of each row from character offsets (-1 on special tokens); only a word's
    first token may be drawn, so every word has the same chance however many pieces it has."""
    offsets = torch.as_tensor(as_list(offset_mapping))
    special = torch.as_tensor(as_list(special_tokens_mask)).bool()
    starts, ends = offsets[..., 0], offsets[..., 1]
    previous_ends = torch.roll(ends, 1, dims=1)
    previous_ends[:, 0] = -1
    previous_special = torch.roll(special, 1, dims=1)
    previous_special[:, 0] = False
    # a token starts a word when it does not touch the previous token, or that one was special
    starts_word = ~special & ((starts != previous_ends) | previous_special)
    word_ids = starts_word.long().cumsum(dim=1)
    word_ids[special] = -1
    return word_ids, ~starts_word


def _spread_to_whole_words(word_ids: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    valid = word_ids != -1
    same_word = (word_ids[:, :, None] == word_ids[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    return (same_word & masked[:, None, :]).any(dim=2)


@dataclass
class DataCollatorForLanguageModeling:
    """Pad token sequences and build `labels`: causal LM (`mlm=False`) copies `input_ids` with padding
    set to -100; masked LM draws `mlm_probability` of the non-special tokens as targets, and of those
    replaces `mask_replace_prob` by the mask token, `random_replace_prob` by a random token, and keeps
    the rest. `seed` gives the collator its own generator (offset by the DataLoader worker id)."""

    tokenizer: Any
    mlm: bool = True
    whole_word_mask: bool = False
    mlm_probability: float | None = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"
    seed: int | None = None

    def __post_init__(self):
        _check_return_tensors(self.return_tensors)
        if self.mlm:
            if getattr(self.tokenizer, "mask_token_id", None) is None:
                raise ValueError(
                    "This tokenizer has no mask token, which masked language modeling needs. "
                    "Pass `mlm=False` to train a causal language model instead."
                )
            if self.mlm_probability is None or not 0 <= self.mlm_probability <= 1:
                raise ValueError(f"mlm_probability must be between 0 and 1, got {self.mlm_probability!r}.")
            self.mlm_probability = float(self.mlm_probability)
        elif self.whole_word_mask:
            raise ValueError("whole_word_mask=True needs mlm=True.")
        for name in ("mask_replace_prob", "random_replace_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be between 0 and 1, got {getattr(self, name)!r}.")
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise ValueError("mask_replace_prob + random_replace_prob must not exceed 1.")
        if self.whole_word_mask and self.mask_replace_prob < 1:
            warnings.warn("Whole word masking replaces whole words by the mask token only: setting mask_replace_prob=1.")
            self.mask_replace_prob, self.random_replace_prob = 1.0, 0.0
        self.mask_replace_prob = float(self.mask_replace_prob)
        self.random_replace_prob = float(self.random_replace_prob)
        if self.mlm and self.random_replace_prob > 0 and _vocabulary_size(self.tokenizer) is None:
            raise ValueError(
                "Random replacement draws token ids from the vocabulary: give the tokenizer `__len__` or "
                "`vocab_size`, or set random_replace_prob=0."
            )
        # Made on first call, not here: each DataLoader worker must seed its own copy (seed + worker id),
        # otherwise all workers would draw identical masks.
        self.generator = None

    def _make_generator(self) -> torch.Generator:
        worker = torch.utils.data.get_worker_info()
        return torch.Generator().manual_seed(self.seed + (worker.id if worker is not None else 0))

    def __call__(self, examples: list, return_tensors: str | None = None) -> dict:
        _check_return_tensors(return_tensors or self.return_tensors)
        return self.torch_call(examples)

    def torch_call(self, examples: list) -> dict:
        if self.seed is not None and self.generator is None:
            self.generator = self._make_generator()
        if isinstance(examples[0], Mapping):
            batch = pad_batch(self.tokenizer, examples, pad_to_multiple_of=self.pad_to_multiple_of)
        else:
            batch = {"input_ids": stack_or_pad_sequences(examples, self.tokenizer, self.pad_to_multiple_of)}
        special_tokens_mask = batch.pop("special_tokens_mask", None)
        offset_mapping = batch.pop("offset_mapping", None)
        if self.mlm:
            batch["input_ids"], batch["labels"] = self.torch_mask_tokens(
                batch["input_ids"], special_tokens_mask=special_tokens_mask, offset_mapping=offset_mapping
            )
        else:
            labels = batch["input_ids"].clone()
            pad_token_id = getattr(self.tokenizer, "pad_token_id", None)
            # As in transformers, this also hides eos from the loss when pad_token is set to eos.
            if pad_token_id is not None:
                labels[labels == pad_token_id] = -100
            batch["labels"] = labels
        return batch

    def torch_mask_tokens(self, inputs: torch.Tensor, special_tokens_mask=None, offset_mapping=None):
        """Return (masked inputs, labels); labels are -100 everywhere except the drawn targets.

        The draws (one Bernoulli matrix for targets, one for "mask token", one for "random token",
        then one randint) run in transformers' order, so the same seed gives the same batch."""
        labels = inputs.clone()
        probability = torch.full(labels.shape, self.mlm_probability)
        if special_tokens_mask is None:
            special_tokens_mask = [_special_tokens_mask(self.tokenizer, row) for row in labels.tolist()]
        if self.whole_word_mask:
            if offset_mapping is None:
                raise ValueError("whole_word_mask needs `offset_mapping` in the items (return_offsets_mapping=True).")
            word_ids, unmaskable = _word_ids_and_unmaskable(offset_mapping, special_tokens_mask)
        else:
            unmaskable = torch.as_tensor(as_list(special_tokens_mask)).bool()
        probability.masked_fill_(unmaskable, 0.0)
        masked = torch.bernoulli(probability, generator=self.generator).bool()
        if self.whole_word_mask:
            masked = _spread_to_whole_words(word_ids, masked)
        labels[~masked] = -100

        draw = torch.full(labels.shape, self.mask_replace_prob)
        replaced = torch.bernoulli(draw, generator=self.generator).bool() & masked
        inputs[replaced] = self.tokenizer.mask_token_id
        if self.mask_replace_prob == 1 or self.random_replace_prob == 0:
            return inputs, labels
        # conditional on not being replaced by the mask token, so overall P(random) = random_replace_prob
        draw = torch.full(labels.shape, self.random_replace_prob / (1 - self.mask_replace_prob))
        randomised = torch.bernoulli(draw, generator=self.generator).bool() & masked & ~replaced
        random_words = torch.randint(_vocabulary_size(self.tokenizer), labels.shape, generator=self.generator)
        inputs[randomised] = random_words[randomised]
        return inputs, labels


def _vocabulary_size(tokenizer) -> int | None:
    # len() counts added tokens too (transformers draws from it); vocab_size alone does not
    return len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", None)


# ---------------------------------------------------------------------------- padding-free packing


class DataCollatorWithFlattening(DefaultDataCollator):
    """Pack the whole batch into one row with no padding: `input_ids`, `labels` and `position_ids`
    of shape (1, total tokens), positions restarting at each example so attention kernels that
    read them (or `cu_seq_lens_*` / `seq_idx`) keep the examples apart."""

    def __init__(
        self,
        *args,
        return_position_ids=True,
        separator_id=-100,
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
        _check_return_tensors(return_tensors or self.return_tensors)
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
        return batch
