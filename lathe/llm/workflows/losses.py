"""LLaMA-Factory 0.9.5's SFT loss variants, as `compute_loss_func`s for the Trainer (stage sft only).

- DFT (`use_dft_loss`): each target token's cross-entropy weighted by its probability under the model,
  detached: p * (-log p). Sums over the accumulation window's tokens / num_items_in_batch, like the plain loss.
- EAFT (`use_eaft_loss`): the weight is (H / 3) ** eaft_alpha, H the entropy of the softmax over the 20
  largest logits (detached), an entropy-adaptive weight.
- ASFT (`use_asft_loss`): the DFT loss plus asft_alpha x KL(reference || model) per target token, against a
  frozen copy of the starting model. As in LLaMA-Factory, both terms are means over the micro-batch's
  tokens and the sum over the accumulation window is not divided by it (the Trainer does not normalise a
  loss that compute_loss_func returns).
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

__all__ = ["dft_loss", "eaft_loss", "asft_loss", "loss_function_for"]

IGNORE_INDEX = -100


def _shifted(outputs, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits flattened to (tokens, vocab) in float32, the next-token labels aligned with them)."""
    logits = outputs["logits"].float()
    next_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    return logits.reshape(-1, logits.size(-1)), next_labels.reshape(-1).to(logits.device)


def _weighted_mean(token_loss: torch.Tensor, weights: torch.Tensor, num_items_in_batch) -> torch.Tensor:
    weighted = token_loss * weights
    if num_items_in_batch is None:
        return weighted.mean()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(weighted.device)
    return weighted.sum() / num_items_in_batch


def _dft_tokens(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    kept = labels != IGNORE_INDEX
    if not kept.any():
        return torch.tensor(0.0, device=logits.device, dtype=logits.dtype)
    token_loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")[kept]
    return _weighted_mean(token_loss, torch.exp(-token_loss).detach(), num_items_in_batch)


def dft_loss(outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    if outputs.get("logits") is None:
        return outputs.get("loss", torch.tensor(0.0))
    logits, next_labels = _shifted(outputs, labels)
    return _dft_tokens(logits, next_labels, num_items_in_batch)


def eaft_loss(outputs, labels: torch.Tensor, num_items_in_batch=None, alpha: float = 1.0) -> torch.Tensor:
    if outputs.get("logits") is None:
        return outputs.get("loss", torch.tensor(0.0))
    logits, next_labels = _shifted(outputs, labels)
    kept = next_labels != IGNORE_INDEX
    if not kept.any():
        return torch.tensor(0.0, device=logits.device, dtype=logits.dtype)
    token_loss = F.cross_entropy(logits, next_labels, ignore_index=IGNORE_INDEX, reduction="none")[kept]
    with torch.no_grad():
        top = torch.topk(logits[kept].detach(), k=20, dim=-1).values
        log_probs = top - torch.logsumexp(top, dim=-1, keepdim=True)
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
        weights = torch.pow(entropy / 3.0, alpha)
    return _weighted_mean(token_loss, weights, num_items_in_batch)


def asft_loss(outputs, labels: torch.Tensor, reference_logits: torch.Tensor, alpha: float = 0.1) -> torch.Tensor:
    if outputs.get("logits") is None:
        return outputs.get("loss", torch.tensor(0.0))
    logits = outputs["logits"].float()[..., :-1, :]
    vocab = logits.size(-1)
    logits = logits.reshape(-1, vocab)
    reference = reference_logits[..., :-1, :].reshape(-1, vocab)
    next_labels = labels[..., 1:].reshape(-1).to(logits.device)
    # KL(q || p) per position: sum_v q_v (log q_v - log p_v), q the reference's distribution.
    kl = F.kl_div(F.log_softmax(logits, dim=-1), F.softmax(reference, dim=-1), reduction="none").sum(dim=-1)
    mask = (next_labels != IGNORE_INDEX).float()
    kl_loss = (kl * mask).sum() / mask.sum()
    return _dft_tokens(logits, next_labels) + alpha * kl_loss


def loss_function_for(finetuning_args):
    """The compute_loss_func for DFT or EAFT (ASFT needs the reference model: the trainer calls asft_loss)."""
    if finetuning_args.use_dft_loss:
        return dft_loss
    if finetuning_args.use_eaft_loss:
        return partial(eaft_loss, alpha=finetuning_args.eaft_alpha)
    return None
