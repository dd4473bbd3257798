"""Label smoothing applied to a model's logits (TrainingArguments.label_smoothing_factor)."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from lathe.train.data.labels import IGNORE_INDEX


class LabelSmoother:
    """Cross-entropy with label smoothing `epsilon`, averaged over non-ignored labels, the same
    mix as transformers: (1 - eps) * nll + eps * mean over classes of -log p."""

    def __init__(self, epsilon: float = 0.1, ignore_index: int = IGNORE_INDEX):
        self.epsilon = epsilon
        self.ignore_index = ignore_index

    def __call__(
        self, model_output, labels: torch.Tensor, shift_labels: bool = False, num_items_in_batch=None
    ) -> torch.Tensor:
        """With num_items_in_batch (the label count of the whole accumulation window), the sums are
        divided by it, so accumulated micro-batches add up to the loss of one big batch."""
        logits = model_output["logits"] if isinstance(model_output, dict) else model_output[0]
        if shift_labels:
            logits = logits[..., :-1, :].contiguous()
            labels = labels[..., 1:].contiguous()
        log_probs = -F.log_softmax(logits.float(), dim=-1)
        if labels.dim() == log_probs.dim() - 1:
            labels = labels.unsqueeze(-1)
        padding = labels.eq(self.ignore_index)
        safe_labels = labels.clamp(min=0)
        nll = log_probs.gather(dim=-1, index=safe_labels).masked_fill(padding, 0.0)
        smoothed = log_probs.sum(dim=-1, keepdim=True).masked_fill(padding, 0.0)
        if num_items_in_batch is None:
            active = padding.numel() - padding.long().sum()
        else:
            active = num_items_in_batch.to(nll.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch
        nll = nll.sum() / active
        smoothed = smoothed.sum() / (active * log_probs.shape[-1])
        return (1 - self.epsilon) * nll + self.epsilon * smoothed


def label_smoother_for(model, factor: float) -> LabelSmoother | None:
    """The Trainer's label smoother for label_smoothing_factor, or None (0, or a multi-label model)."""
    if not factor:
        return None
    if getattr(getattr(model, "config", None), "problem_type", None) == "multi_label_classification":
        # Smoothing one-hot targets has no meaning for independent per-label targets (transformers' rule).
        message = "Label smoothing is not compatible with multi-label classification. Disabling label smoothing for this training run."
        warnings.warn(message, UserWarning, stacklevel=3)
        return None
    return LabelSmoother(epsilon=factor)
