"""The sequence log-probabilities preference training needs from one forward pass: from the full logits
(the model's own path), or chunk by chunk with the logits never whole (lathe.train.loss.chunked), as the
Trainer's causal-LM loss path says; and the logits' per-row sums the logits/* metrics report."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lathe.llm.preference import losses
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.loss.causal_lm import HeadIntercept, active_path, unwrap
from lathe.train.loss.chunked import chunked_token_log_probs, is_plain_linear


class RowLogits:
    """What the logits/* metrics read from the logits of some rows: the full tensor, or (chunked) each
    row's sum over positions and vocabulary with the number of values per row."""

    def __init__(self, logits=None, sums=None, per_row: int = 0):
        self.logits, self.sums, self.per_row = logits, sums, per_row

    def rows(self, index) -> RowLogits:
        if self.logits is not None:
            return RowLogits(logits=self.logits[index])
        return RowLogits(sums=self.sums[index], per_row=self.per_row)

    def split(self, size: int) -> tuple[RowLogits, RowLogits]:
        return self.rows(slice(0, size)), self.rows(slice(size, None))

    def mean(self) -> torch.Tensor:
        if self.logits is not None:
            return self.logits.mean()
        return self.sums.sum() / (self.sums.numel() * self.per_row)

    def nansum(self) -> torch.Tensor:
        return self.logits.nansum() if self.logits is not None else self.sums.nansum()


def forward_log_probs(trainer, model, inputs: dict, labels: torch.Tensor, ld_alpha: float | None = None):
    """(summed log-probs per row, answer lengths, RowLogits) of model(**inputs) scored against labels."""
    path = active_path(trainer)
    if path is None:
        logits = model(**inputs, return_dict=True, use_cache=False).logits.to(torch.float32)
        logps, lengths = losses.sequence_log_probs(logits, labels, ld_alpha=ld_alpha)
        return logps, lengths, RowLogits(logits=logits)

    def request(hidden, head):
        return _token_log_probs(hidden, head, labels, path.softcap, path.chunk_size)

    # The labels go in so the result comes back as the forward's `loss` (DDP / FSDP2 hook backward onto it).
    intercept = HeadIntercept.on(unwrap(model))
    run_inputs = {**inputs, "labels": labels, "return_dict": True, "use_cache": False}
    (token_logps, mask, sums), _ = intercept.run(model, run_inputs, request)
    logps, lengths = losses.summed_log_probs(token_logps, mask, ld_alpha)
    return logps, lengths, RowLogits(sums=sums, per_row=labels.shape[-1] * unwrap(model).config.vocab_size)


def _token_log_probs(hidden, head, labels, softcap, chunk_size):
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"hidden states {tuple(hidden.shape)} and labels {tuple(labels.shape)} do not line up.")
    targets = labels[:, 1:].to(hidden.device)
    mask = targets != IGNORE_INDEX
    kept = chunked_token_log_probs(hidden[:, :-1][mask], head, targets[mask], softcap=softcap, chunk_size=chunk_size)
    token_logps = torch.zeros(mask.shape, dtype=kept.dtype, device=kept.device).masked_scatter(mask, kept)
    with torch.no_grad():
        sums = _logit_sums(hidden.detach(), head, softcap, chunk_size)
    return token_logps, mask, sums


def _logit_sums(hidden, head, softcap, chunk_size):
    """Each row's logits summed over positions and vocabulary, without building them: for a linear head
    the vocabulary sum is one product with the weight's column sums."""
    if is_plain_linear(head) and softcap is None:
        bias = None if head.bias is None else head.bias.float().sum().reshape(1)
        return F.linear(hidden.float(), head.weight.float().sum(0, keepdim=True), bias).sum((1, 2))
    flat = hidden.reshape(-1, hidden.shape[-1])
    parts = []
    for start in range(0, flat.shape[0], chunk_size):
        logits = head(flat[start : start + chunk_size]).float()
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        parts.append(logits.sum(-1))
    return torch.cat(parts).reshape(hidden.shape[:-1]).sum(-1)
