"""Byte counts the memory plan's terms share: the loss's logits peak, a quantized linear weight and a weight
bitsandbytes has already packed. A leaf: plan.py and preference.py both take these from here."""

from __future__ import annotations


def logits_bytes(shape, batch: int, seq_len: int, half: bool, chunk: int | None, head_trains: bool) -> int:
    """The loss's peak. Standard path: during backward the fp32 log-probabilities, their gradient and the
    logits' gradient coexist (3 x tokens x vocab x 4 bytes), plus the half-precision logits under autocast.
    Chunked path (lathe.train.loss.chunked): a chunk's fp32 logits and logsumexp's temporary of that size,
    plus the previous chunk's logits while the next are computed (when there are several chunks); the
    labelled hidden states, their gradient and its scaled copy; a trained head's weight gradient and the
    chunk's contribution to it."""
    tokens = batch * seq_len
    if chunk is None:
        return tokens * shape.vocab * (3 * 4 + (2 if half else 0))
    element = 2 if half else 4
    head = 2 * shape.vocab * shape.hidden * 4 if head_trains else 0
    buffers = 2 if chunk >= tokens else 3
    return buffers * min(chunk, tokens) * shape.vocab * 4 + 3 * tokens * shape.hidden * element + head


def quantized_bytes(module, bits: int, double_quant: bool) -> int:
    """A bitsandbytes-quantized linear weight: packed values plus the block scales (blocks of 64)."""
    elements = module.in_features * module.out_features
    if bits == 8:
        return elements + module.out_features * 4
    scales = elements // 64 + elements // (64 * 256) * 4 if double_quant else elements // 64 * 4
    return elements * bits // 8 + scales


def packed_bytes(param) -> int:
    """A weight bitsandbytes has packed (uint8 / int8), with its block scales (absmax)."""
    state = getattr(param, "quant_state", None)
    absmax = getattr(state, "absmax", None)
    return param.numel() * param.element_size() + (absmax.numel() * absmax.element_size() if absmax is not None else 0)
