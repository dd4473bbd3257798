"""LLaMA-Factory 0.9.5's SFT loss variants (stage sft), and the mixin that puts them in the sft Trainer:
compute_loss_func for DFT and EAFT, compute_loss for ASFT (which also runs a frozen reference model).

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

from lathe.train.data.labels import IGNORE_INDEX

__all__ = ["LossVariantsMixin", "asft_loss", "dft_loss", "eaft_loss", "load_reference_model", "loss_function_for"]


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


class LossVariantsMixin:
    """Mixed into the sft Trainer: takes `finetuning_args` (passed on) and, for ASFT, `ref_model`."""

    def __init__(self, *args, finetuning_args=None, ref_model=None, **kwargs):
        super().__init__(*args, finetuning_args=finetuning_args, **kwargs)
        self.ref_model = None
        if finetuning_args is None:
            return
        loss_function = loss_function_for(finetuning_args)
        if finetuning_args.use_asft_loss:
            if ref_model is None:
                raise ValueError("use_asft_loss needs the reference model (ref_model).")
            # compute_loss below calls it; being set, it also tells the step maths not to divide the loss by
            # the accumulation steps (LLaMA-Factory's ASFT loss is a per-micro-batch mean, summed).
            loss_function = asft_loss
            self.ref_model = ref_model.to(self.args.device)
        if loss_function is not None:
            self.compute_loss_func = loss_function

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.ref_model is None:  # with ASFT, evaluation computes its loss too, as in LLaMA-Factory
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        with torch.no_grad():  # the reference sees what LLaMA-Factory gives it: ids and mask, no positions
            reference = self.ref_model(
                input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask")
            ).logits
        outputs = model(**inputs)
        loss = self.compute_loss_func(outputs, inputs["labels"], reference, alpha=self.finetuning_args.asft_alpha)
        return (loss, outputs) if return_outputs else loss


def load_reference_model(tokenizer, model_args, finetuning_args):
    """ASFT's reference: the starting model, frozen, in the training's compute dtype (None when not needed)."""
    if not finetuning_args.use_asft_loss:
        return None
    from lathe.llm.model.frozen import load_frozen_copy

    return load_frozen_copy(tokenizer, model_args, "full")
