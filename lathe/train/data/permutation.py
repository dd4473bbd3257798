"""DataCollatorForPermutationLanguageModeling: XLNet's permutation LM targets (masked spans, a
factorisation order per row as `perm_mask`, `target_mapping`), with transformers' draws in its order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from lathe.train.data.collator_base import DataCollatorMixin, check_return_tensors
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.data.masking import special_tokens_mask_of
from lathe.train.data.padding import stack_or_pad_sequences

__all__ = ["DataCollatorForPermutationLanguageModeling"]


@dataclass
class DataCollatorForPermutationLanguageModeling(DataCollatorMixin):
    """Batch token sequences (dict items give their `input_ids`), then per row mask spans of 1 to
    `max_span_length` tokens, one per context of span/`plm_probability` tokens, and draw a factorisation
    order that never lets a masked token see itself. Draws come from torch's global generator in
    transformers' order, so `set_seed` gives transformers' batch; "np" gives the same draws as arrays."""

    tokenizer: Any
    plm_probability: float = 1 / 6
    max_span_length: int = 5  # the longest span of masked tokens
    return_tensors: str = "pt"

    def __post_init__(self):
        check_return_tensors(self.return_tensors)
        if not 0 < self.plm_probability <= 1:
            raise ValueError(f"plm_probability must be in (0, 1], got {self.plm_probability!r}.")
        if self.max_span_length < 1:
            raise ValueError(f"max_span_length must be at least 1, got {self.max_span_length!r}.")

    def torch_call(self, examples: list) -> dict:
        if isinstance(examples[0], Mapping):
            examples = [example["input_ids"] for example in examples]
        examples = [torch.as_tensor(example, dtype=torch.long) for example in examples]
        batch = stack_or_pad_sequences(examples, self.tokenizer, None)
        inputs, perm_mask, target_mapping, labels = self.torch_mask_tokens(batch)
        return {"input_ids": inputs, "perm_mask": perm_mask, "target_mapping": target_mapping, "labels": labels}

    def torch_mask_tokens(self, inputs: torch.Tensor) -> tuple:
        """(inputs with the spans masked, perm_mask, target_mapping, labels); `inputs` is changed in place."""
        if getattr(self.tokenizer, "mask_token_id", None) is None:
            raise ValueError("Permutation language modeling needs a tokenizer with a mask token; this one has none.")
        rows, length = inputs.shape
        if length % 2 != 0:
            # the order permutes two halves against each other; an odd length would let tokens leak
            raise ValueError(
                f"DataCollatorForPermutationLanguageModeling needs an even sequence length, got {length}: "
                "pad or truncate the sequences to an even length."
            )
        labels = inputs.clone()
        masked = torch.zeros(labels.shape, dtype=torch.bool)
        for row in range(rows):
            masked[row] = self._draw_spans(length)
        target_mapping = torch.eye(length, dtype=torch.float32).expand(rows, length, length).clone()
        special = torch.tensor(
            [special_tokens_mask_of(self.tokenizer, row) for row in labels.tolist()], dtype=torch.bool
        )
        pad_token_id = getattr(self.tokenizer, "pad_token_id", None)
        padding = labels.eq(pad_token_id) if pad_token_id is not None else torch.zeros_like(special)
        masked &= ~(special | padding)
        functional = padding | special  # [CLS], [SEP], padding: never visible to a masked token
        inputs[masked] = self.tokenizer.mask_token_id
        labels[~masked] = IGNORE_INDEX
        perm_mask = torch.zeros((rows, length, length), dtype=torch.float32)
        for row in range(rows):
            perm_mask[row] = self._permutation_mask(length, masked[row], functional[row])
        return inputs.long(), perm_mask, target_mapping, labels.long()

    def _draw_spans(self, length: int) -> torch.Tensor:
        masked = torch.zeros(length, dtype=torch.bool)
        position = 0
        while position < length:
            span = torch.randint(1, self.max_span_length + 1, (1,)).item()
            context = int(span / self.plm_probability)
            start = position + torch.randint(context - span + 1, (1,)).item()
            masked[start : start + span] = True
            position += context
        return masked

    @staticmethod
    def _permutation_mask(length: int, masked: torch.Tensor, functional: torch.Tensor) -> torch.Tensor:
        # order: the two halves interleaved, their pairs shuffled; visible tokens get -1 (seen by all)
        order = torch.arange(length).reshape(-1, length // 2).transpose(0, 1)
        order = order[torch.randperm(length // 2)]
        order = torch.flatten(order.transpose(0, 1))
        order.masked_fill_(~masked & ~functional, -1)
        return (order.reshape(length, 1) <= order.reshape(1, length)) & masked
