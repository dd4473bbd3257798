"""The sft collator: pads rows into a batch, and keeps packed examples from attending to each other.

Unpacked rows (input_ids, attention_mask, labels) are padded on the tokenizer's padding side: input ids
with the pad token, attention_mask with 0, labels with `label_pad_token_id` (-100: never trained).

Packed rows (packing.py: they carry `position_ids` restarting at 0 per example) need attention that
cannot cross examples. What transformers 5.23 does with packed rows, checked on CPU (tests/llm/test_packing.py):
- eager and sdpa: a 4-D mask (batch, 1, length, length) is used as given. transformers can also infer
  the example boundaries from position_ids, but only when attention_mask is None *and* no KV cache is
  made (`use_cache=False`; a model with `config.use_cache=True`, the default, makes one even in training
  and then silently lets examples attend to each other). So lathe builds the block-diagonal causal mask
  itself: boolean for sdpa (True = attend; 1 byte per pair), 0 / dtype-min in the model's dtype for eager
  (which adds the mask to the scores). Cost: batch x length^2 bytes (x4 in float32 for eager).
- flash attention kernels take no 4-D mask; they find the boundaries from position_ids or cu_seq_lens
  (varlen), only for a batch of one row without attention_mask. For them, flex_attention and lathe's
  per-example sdpa (lathe/llm/model/packed_attention.py, used for packed sdpa models: no mask at all)
  the rows are flattened into one row without padding, with position_ids, the boundaries as
  cu_seq_lens_q/k and no attention_mask ("position_ids" mode).
Padding in a packed row is a segment of its own (positions 0, 1, ...), so it never mixes with an example.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.data.padding import get_pad_token_id, get_padding_side, pad_rows, round_up

PACKED_ATTENTION_MODES = ("auto", "mask", "position_ids")


class SFTDataCollator:
    """Batch sft rows, packed or not, for a causal LM.

    `model` is read for its attention implementation and dtype (it picks how packed rows are kept apart
    when `packed_attention="auto"`). `neat_packing` is accepted for LLaMA-Factory's arguments: lathe keeps
    packed examples apart either way (LLaMA-Factory's plain packing lets them attend to each other)."""

    def __init__(
        self,
        tokenizer,
        model=None,
        pad_to_multiple_of: int | None = None,
        label_pad_token_id: int = IGNORE_INDEX,
        neat_packing: bool = False,
        packed_attention: str = "auto",
        return_tensors: str = "pt",
    ):
        if packed_attention not in PACKED_ATTENTION_MODES:
            raise ValueError(f"packed_attention must be one of {PACKED_ATTENTION_MODES}, got {packed_attention!r}.")
        if return_tensors != "pt":
            raise ValueError(f"SFTDataCollator returns PyTorch tensors only, got return_tensors={return_tensors!r}.")
        self.tokenizer = tokenizer
        self.model = model
        self.pad_to_multiple_of = pad_to_multiple_of
        self.label_pad_token_id = label_pad_token_id
        self.neat_packing = neat_packing
        self.packed_attention = packed_attention

    def __call__(self, features: list[Mapping[str, Any]]) -> dict[str, Any]:
        if not features:
            raise ValueError("SFTDataCollator got an empty batch.")
        if "position_ids" not in features[0]:
            return self._pad_rows(features)
        if self._packed_mode() == "position_ids":
            return self._flatten_packed_rows(features)
        return self._pad_packed_rows(features)

    # ------------------------------------------------------------------ helpers

    def _packed_mode(self) -> str:
        if self.packed_attention != "auto":
            return self.packed_attention
        implementation = str(attention_implementation(self.model) or "eager")
        flattened = "flash" in implementation or implementation in ("flex_attention", "lathe_packed_sdpa")
        return "position_ids" if flattened else "mask"

    def _length(self, lengths: list[int]) -> int:
        return round_up(max(lengths), self.pad_to_multiple_of or None)

    def _pad_rows(self, features) -> dict[str, Any]:
        """Inputs padded to the longest row; labels to the longest labels (as transformers'
        DataCollatorForSeq2Seq: generation rows hold the reference answer, not one label per token)."""
        right = get_padding_side(self.tokenizer) == "right"
        lengths = [len(feature["input_ids"]) for feature in features]
        batch = {
            "input_ids": self._pad(
                [feature["input_ids"] for feature in features], get_pad_token_id(self.tokenizer), right
            ),
            "attention_mask": self._pad([[1] * size for size in lengths], 0, right),
        }
        if features[0].get("labels") is not None:
            batch["labels"] = self._pad([feature["labels"] for feature in features], self.label_pad_token_id, right)
        return batch

    def _pad(self, rows: list, value: int, right: bool):
        return pad_rows(rows, value, self._length([len(row) for row in rows]), "right" if right else "left")

    def _pad_packed_rows(self, features) -> dict[str, Any]:
        import torch

        batch = self._pad_rows(features)
        length, right = batch["input_ids"].shape[1], get_padding_side(self.tokenizer) == "right"
        position_ids = torch.zeros_like(batch["input_ids"])
        for row, feature in enumerate(features):
            padding = length - len(feature["input_ids"])
            positions = torch.as_tensor(feature["position_ids"], dtype=torch.long)
            pad_positions = torch.arange(padding, dtype=torch.long)  # the padding is one more segment
            position_ids[row] = torch.cat([positions, pad_positions] if right else [pad_positions, positions])
        batch["position_ids"] = position_ids
        batch["attention_mask"] = block_diagonal_mask(
            position_ids, attention_implementation(self.model), model_dtype(self.model)
        )
        return batch

    def _flatten_packed_rows(self, features) -> dict[str, Any]:
        import torch

        input_ids = [token for feature in features for token in feature["input_ids"]]
        position_ids = [position for feature in features for position in feature["position_ids"]]
        labels = [label for feature in features for label in feature["labels"]] if "labels" in features[0] else None
        padding = self._length([len(input_ids)]) - len(input_ids)
        input_ids += [get_pad_token_id(self.tokenizer)] * padding if padding else []
        position_ids += range(padding)
        batch = {
            "input_ids": torch.tensor([input_ids], dtype=torch.long),
            "position_ids": torch.tensor([position_ids], dtype=torch.long),
        }
        # The example boundaries, as transformers' varlen attention reads them (flash attention and
        # lathe's per-example sdpa, lathe/llm/model/packed_attention.py).
        starts = [index for index, position in enumerate(position_ids) if position == 0] + [len(position_ids)]
        cu_seq_lens = torch.tensor(starts, dtype=torch.int32)
        longest = max(end - start for start, end in zip(starts[:-1], starts[1:]))
        batch.update(cu_seq_lens_q=cu_seq_lens, cu_seq_lens_k=cu_seq_lens, max_length_q=longest, max_length_k=longest)
        if labels is not None:
            batch["labels"] = torch.tensor([labels + [self.label_pad_token_id] * padding], dtype=torch.long)
        return batch


def block_diagonal_mask(position_ids, implementation: str | None = None, dtype=None):
    """The 4-D attention mask (batch, 1, length, length) of packed rows: token i sees token j <= i of its
    own example only; an example starts wherever position_ids is 0.

    Boolean (True = attend) for sdpa; otherwise additive, 0 or the dtype's minimum (not -inf: a row
    with nothing to attend to would turn into NaN), in `dtype` (default float32)."""
    import torch

    segments = (position_ids == 0).cumsum(-1)
    length = position_ids.shape[-1]
    causal = torch.ones((length, length), dtype=torch.bool, device=position_ids.device).tril()
    allowed = (segments[:, :, None] == segments[:, None, :]) & causal
    allowed = allowed[:, None]
    if implementation == "sdpa":
        return allowed
    dtype = dtype or torch.float32
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


def attention_implementation(model) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) if config is not None else None


def model_dtype(model):
    import torch

    if model is None:
        return torch.float32
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.float32
