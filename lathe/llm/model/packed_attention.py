"""Attention for packed rows that computes each example on its own: no block-diagonal mask.

With a 4-D block-diagonal mask, sdpa still computes every query-key pair of a packed row (the masked
ones included): a row of 512 positions costs 512 x 512 pairs whatever its examples' lengths. Run per
example, it costs the sum of their squares (for the workflow bench's data about a fifth). On GPU the
flash kernels do this from position_ids (varlen); this is the same for sdpa, on any device.

How it plugs in: transformers 5 looks attention up by name (AttentionInterface) and builds masks
through a per-name mask function (AttentionMaskInterface). Under the name `lathe_packed_sdpa`:
- the collator flattens a batch of packed rows into one row with no padding mask, and passes the
  example boundaries as `cu_seq_lens_q` (the kwargs transformers' flash attention reads), with
  `position_ids` restarting at 0 per example (the fallback when a model does not forward them);
- the mask function builds no mask for such a row (nothing to mask beyond causality per example),
  and defers to sdpa's for everything else (padded batches, generation with a cache);
- the attention function runs causal sdpa per example on that row, and plain sdpa otherwise.
The result equals the masked computation (tests/llm/test_packed_attention.py: outputs and gradients).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

NAME = "lathe_packed_sdpa"
_registered = False


def _example_bounds(query, kwargs) -> list[int] | None:
    """[0, end_1, end_2, ..., length] of the examples in a one-row batch, or None if unknown."""
    import torch

    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is not None:
        return [int(v) for v in cu_seq_lens.tolist()]
    position_ids = kwargs.get("position_ids")
    if position_ids is None or position_ids.shape[-1] != query.shape[2]:
        return None
    starts = torch.nonzero(position_ids.reshape(-1) == 0).flatten().tolist()
    if not starts or starts[0] != 0:
        return None  # positions that do not start at 0 (a continuation): not a packed row
    return starts + [query.shape[2]]


def packed_sdpa_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """query/key/value: (batch, heads, length, head_dim); returns (batch, length, heads, head_dim), None."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    same_length = query.shape[2] == key.shape[2]
    bounds = _example_bounds(query, kwargs) if attention_mask is None and query.shape[0] == 1 and same_length else None
    if bounds is None or len(bounds) <= 2:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # split, not slices: the backward of a split is one concatenation, of a slice a zero-filled
    # full-size gradient per example (a sixth of the step here).
    lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:])]
    outputs = [
        sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True)[0]
        for q, k, v in zip(query.split(lengths, dim=2), key.split(lengths, dim=2), value.split(lengths, dim=2))
    ]
    return torch.cat(outputs, dim=1), None


def packed_sdpa_mask(
    batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0, attention_mask=None, **kwargs
):
    """No mask for a one-row batch without padding mask and without a cache (the packed training row,
    or one prompt); sdpa's mask for everything else."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None and batch_size == 1 and q_length == kv_length and q_offset == 0 and kv_offset == 0:
        return None
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        attention_mask=attention_mask,
        **kwargs,
    )


def register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, packed_sdpa_attention)
    AttentionMaskInterface.register(NAME, packed_sdpa_mask)
    _registered = True


def unsupported_reason(model) -> str | None:
    """Why per-example attention cannot replace the model's attention, or None if it can."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        return "not a transformers model"
    current = getattr(config, "_attn_implementation", None)
    if current not in ("sdpa", NAME):
        return f"its attention is {current!r}, not sdpa"
    if not getattr(model, "_supports_attention_backend", False):
        return "it does not take attention functions by name"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return "it uses sliding-window attention"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    return None


def use_packed_attention(model) -> bool:
    """Switch the model's sdpa attention to per-example attention for packed rows; False (and the
    4-D block mask stays) where the model cannot take it."""
    reason = unsupported_reason(model)
    if reason is not None:
        logger.info("Packed rows keep a block-diagonal attention mask: %s.", reason)
        return False
    register()
    model.set_attn_implementation(NAME)
    return True
