"""DataCollatorForLanguageModeling: causal-LM labels (padding hidden from the loss) and BERT-style
masked-LM masking (80/10/10, whole words), with transformers' draws in transformers' order."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lathe.train.data.collator_base import DataCollatorMixin, check_return_tensors
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.data.padding import as_list, pad_batch, stack_or_pad_sequences


def special_tokens_mask_of(tokenizer, token_ids: list) -> list:
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
class DataCollatorForLanguageModeling(DataCollatorMixin):
    """Pad token sequences and build `labels`: causal LM (`mlm=False`) copies `input_ids` with padding
    set to -100; masked LM draws `mlm_probability` of the non-special tokens as targets, and of those
    replaces `mask_replace_prob` by the mask token, `random_replace_prob` by a random token, and keeps
    the rest. `seed` gives the collator its own generator (offset by the DataLoader worker id).
    With return_tensors="np" the batch is the same draws as arrays (torch's generator, not NumPy's)."""

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
        check_return_tensors(self.return_tensors)
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
            warnings.warn(
                "Whole word masking replaces whole words by the mask token only: setting mask_replace_prob=1."
            )
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
                labels[labels == pad_token_id] = IGNORE_INDEX
            batch["labels"] = labels
        return batch

    def torch_mask_tokens(self, inputs: torch.Tensor, special_tokens_mask=None, offset_mapping=None):
        """Return (masked inputs, labels); labels are -100 everywhere except the drawn targets.

        The draws (one Bernoulli matrix for targets, one for "mask token", one for "random token",
        then one randint) run in transformers' order, so the same seed gives the same batch."""
        labels = inputs.clone()
        probability = torch.full(labels.shape, self.mlm_probability)
        if special_tokens_mask is None:
            special_tokens_mask = [special_tokens_mask_of(self.tokenizer, row) for row in labels.tolist()]
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
        labels[~masked] = IGNORE_INDEX

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

    def numpy_mask_tokens(self, inputs, special_tokens_mask=None, offset_mapping=None):
        """`torch_mask_tokens` on an array: (masked inputs, labels) as arrays; the input array is left as it was."""
        masked, labels = self.torch_mask_tokens(
            torch.from_numpy(np.array(inputs)), special_tokens_mask=special_tokens_mask, offset_mapping=offset_mapping
        )
        return masked.numpy(), labels.numpy()


def _vocabulary_size(tokenizer) -> int | None:
    # len() counts added tokens too (transformers draws from it); vocab_size alone does not
    return len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", None)
