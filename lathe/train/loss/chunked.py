"""Causal-LM cross-entropy with the LM head computed chunk by chunk over tokens, so the full-vocabulary
logits [tokens, vocab] never exist, in forward or backward: the step maths of the chunked loss.

The loss is transformers' ForCausalLMLoss (labels shifted by padding with -100, sum over labelled tokens
divided by num_items_in_batch, else their mean) and LabelSmoother's mix (1 - eps) * nll + eps * mean over
classes of -log p, computed from the hidden states before the head. Only labelled tokens go through the
head. Two ways to get gradients without holding logits:

- a plain `nn.Linear` head (its weight, tied or not, and bias): `_FusedLinearCrossEntropy` computes the
  gradients of hidden, weight and bias chunk by chunk during the forward pass (softmax minus the smoothed
  one-hot, through the optional final-logit softcap) and only scales them in backward: the same three
  matrix products as the standard path, one chunk of logits alive at a time;
- any other head module (a PEFT LoRA head, ...): each chunk's loss is checkpointed
  (torch.utils.checkpoint) and its logits recomputed in backward, one extra head product per step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lathe.train.data.labels import IGNORE_INDEX

# Logits elements per chunk when no size is given: 256 tokens of a 151,936 vocabulary (~150 MB fp32),
# 1,024 of a 32,000 one. Small enough to vanish beside weights, big enough for efficient matrix products.
_ELEMENTS_PER_CHUNK = 2**25


def _apply_fused(*inputs) -> torch.Tensor:
    return _FusedLinearCrossEntropy.apply(*inputs)


# torch.compile of the fused function on torch < 2.13 returns the right loss but wrong hidden-state gradients
# (docs/TORCH_VERSIONS.md): there torch.compile leaves it out of the graph and it runs eagerly.
if tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13):
    _apply_fused = torch.compiler.disable(_apply_fused)


def default_chunk_size(vocab_size: int) -> int:
    """A power of two near 2**25 / vocab_size tokens, at least 32."""
    return max(32, 2 ** round(math.log2(max(_ELEMENTS_PER_CHUNK / max(vocab_size, 1), 1))))


def next_token_labels(labels: torch.Tensor) -> torch.Tensor:
    """The label each position predicts, as transformers shifts them: pad with -100, drop the first."""
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


def _softcapped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    if softcap is None:
        return logits
    return torch.tanh(logits / softcap) * softcap  # transformers: logits / cap, tanh, * cap


def _chunk_loss_and_grad(logits, labels, smoothing: float, softcap: float | None, want_grad: bool):
    """(summed loss, gradient w.r.t. the raw logits or None) of one chunk; logits are float32 [n, vocab]
    and are overwritten (they become the gradient) to keep one chunk-sized buffer alive."""
    z = _softcapped(logits, softcap)
    lse = torch.logsumexp(z, dim=-1)
    target = z.gather(1, labels.unsqueeze(1)).squeeze(1)
    loss = (lse - target).sum()
    vocab = z.shape[-1]
    if smoothing:
        # sum over classes of -log p = vocab * lse - sum of z; the mix is LabelSmoother's.
        loss = (1 - smoothing) * loss + smoothing * (vocab * lse - z.sum(-1)).sum() / vocab
    if not want_grad:
        return loss, None
    cap_factor = None if softcap is None else 1 - (z / softcap) ** 2  # d tanh-cap / d logits
    grad = z.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place
    grad.scatter_add_(1, labels.unsqueeze(1), torch.full_like(target, smoothing - 1).unsqueeze(1))
    if smoothing:
        grad.sub_(smoothing / vocab)
    if cap_factor is not None:
        grad.mul_(cap_factor)
    return loss, grad


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Summed loss of hidden [n, H] through a linear head; gradients computed in forward, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, smoothing, softcap, chunk_size):
        wants = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if wants[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if wants[1] else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if wants[2] else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        w = weight.to(hidden.dtype)
        b = bias.to(hidden.dtype) if bias is not None else None
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start : start + chunk_size]
            logits = F.linear(h, w, b).float()
            loss, grad = _chunk_loss_and_grad(logits, labels[start : start + chunk_size], smoothing, softcap, True)
            total += loss
            grad = grad.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[start : start + chunk_size] = grad @ w
            if grad_weight is not None:
                grad_weight += (grad.t() @ h).float()
            if grad_bias is not None:
                grad_bias += grad.sum(0).float()
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grads = []
        for grad, dtype in zip(ctx.saved_tensors, ctx.dtypes):
            grads.append(None if grad is None else (grad * grad_output).to(dtype))
        return (*grads, None, None, None, None)


def _summed_loss_no_grad(hidden, weight, bias, labels, smoothing, softcap, chunk_size):
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    w = weight.to(hidden.dtype)
    b = bias.to(hidden.dtype) if bias is not None else None
    for start in range(0, hidden.shape[0], chunk_size):
        logits = F.linear(hidden[start : start + chunk_size], w, b).float()
        total += _chunk_loss_and_grad(logits, labels[start : start + chunk_size], smoothing, softcap, False)[0]
    return total


def _module_chunk_loss(hidden, labels, head, smoothing, softcap):
    logits = _softcapped(head(hidden).float(), softcap)
    return F.cross_entropy(logits, labels, reduction="sum", label_smoothing=smoothing)


def _summed_loss_checkpointed(hidden, head, labels, smoothing, softcap, chunk_size):
    from torch.utils.checkpoint import checkpoint

    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk_size):
        args = (hidden[start : start + chunk_size], labels[start : start + chunk_size], head, smoothing, softcap)
        if torch.is_grad_enabled():
            total = total + checkpoint(_module_chunk_loss, *args, use_reentrant=False)
        else:
            total = total + _module_chunk_loss(*args)
    return total


def is_plain_linear(head: nn.Module) -> bool:
    """Whether the fused path applies: exactly nn.Linear (no subclass such as a LoRA or quantized layer)."""
    return type(head) is nn.Linear


def chunked_causal_lm_loss(
    hidden: torch.Tensor,
    head: nn.Module,
    labels: torch.Tensor,
    *,
    num_items_in_batch=None,
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """The causal-LM loss of hidden states [..., T, H] through `head` against `labels` [..., T] (shifted here
    unless `shift_labels` gives the next-token labels already): summed over labelled tokens and divided by
    num_items_in_batch when given, else by their count; label smoothing mixed as LabelSmoother does."""
    targets = next_token_labels(labels) if shift_labels is None else shift_labels
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"labels {tuple(targets.shape)} do not line up with hidden states {tuple(hidden.shape)}.")
    targets = targets.reshape(-1).to(hidden.device)
    kept = targets != IGNORE_INDEX
    rows = hidden.reshape(-1, hidden.shape[-1])[kept]
    targets = targets[kept]
    size = chunk_size or default_chunk_size(_vocab_size(head))
    if is_plain_linear(head):
        weight, bias = head.weight, head.bias
        needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (rows, weight, bias))
        if needs_grad:
            total = _apply_fused(rows, weight, bias, targets, label_smoothing, softcap, size)
        else:
            total = _summed_loss_no_grad(rows, weight, bias, targets, label_smoothing, softcap, size)
    else:
        total = _summed_loss_checkpointed(rows, head, targets, label_smoothing, softcap, size)
    if num_items_in_batch is None:
        return total / kept.sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _vocab_size(head: nn.Module) -> int:
    weight = getattr(head, "weight", None)
    if weight is None and hasattr(head, "base_layer"):  # PEFT layers keep the original head inside
        weight = getattr(head.base_layer, "weight", None)
    return int(weight.shape[0]) if weight is not None else 32000


def _module_token_log_probs(hidden, labels, head, softcap):
    logits = _softcapped(head(hidden).float(), softcap)
    return logits.gather(1, labels.unsqueeze(1)).squeeze(1) - torch.logsumexp(logits, dim=-1)


def chunked_token_log_probs(hidden, head, labels, *, softcap=None, chunk_size=None):
    """log p(label) per row of hidden [n, H] with labels [n], chunk by chunk: each chunk checkpointed, its
    logits recomputed in backward (the gradient of a log-prob depends on what the caller does with it, so
    it cannot be computed ahead as the fused loss does). What preference training needs from the logits."""
    from torch.utils.checkpoint import checkpoint

    size = chunk_size or default_chunk_size(_vocab_size(head))
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    parts = []
    for start in range(0, hidden.shape[0], size):
        args = (hidden[start : start + size], labels[start : start + size], head, softcap)
        parts.append(
            checkpoint(_module_token_log_probs, *args, use_reentrant=False)
            if wants_grad
            else _module_token_log_probs(*args)
        )
    return torch.cat(parts)
