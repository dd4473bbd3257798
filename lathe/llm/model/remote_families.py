"""What LLaMA-Factory 0.9.5's model patcher does to two vision-language models whose code is the model folder's own
(trust_remote_code): Kimi-VL's MoE routing in training and Youtu-VL's attention and missing loss."""

from __future__ import annotations

import logging
from types import MethodType

logger = logging.getLogger(__name__)

EAGER_ONLY_MODEL_TYPES = ("youtu", "youtu_vl")  # LLaMA-Factory: "Youtu-VL does not support SDPA"


def configure_remote_family(config, is_trainable: bool) -> None:
    """Kimi-VL trains with greedy expert selection (LLaMA-Factory sets its text_config's topk_method; the saved
    config.json keeps it, as LLaMA-Factory's does)."""
    if getattr(config, "model_type", None) == "kimi_vl" and is_trainable:
        config.text_config.topk_method = "greedy"


def eager_attention(flash_attn: str, model_type: str | None) -> bool:
    """Whether the run's attention becomes eager: Youtu-VL's with flash_attn auto or sdpa, as LLaMA-Factory forces it."""
    if model_type in EAGER_ONLY_MODEL_TYPES and flash_attn in ("auto", "sdpa"):
        logger.warning("Youtu-VL does not support SDPA attention: it runs with eager attention, as in LLaMA-Factory.")
        return True
    return False


def patch_missing_loss(model) -> None:
    """Youtu-VL's forward returns logits without a loss when given labels: in training the loss is then the mean
    cross-entropy of the shifted labels over the config's vocabulary, as LLaMA-Factory's patch_youtu_vl_model adds it
    (a plain mean per batch: it does not read num_items_in_batch)."""
    if getattr(model.config, "model_type", None) != "youtu_vl":
        return
    import torch

    forward = model.forward

    def forward_with_loss(self, *args, **kwargs):
        outputs = forward(*args, **kwargs)
        labels, logits = kwargs.get("labels"), outputs.get("logits")
        if "loss" not in outputs and labels is not None and logits is not None:
            shifted = logits[..., :-1, :].contiguous().view(-1, self.config.vocab_size)
            outputs["loss"] = torch.nn.functional.cross_entropy(shifted, labels[..., 1:].contiguous().view(-1))
        return outputs

    model.forward = MethodType(forward_with_loss, model)
