"""The frozen copy of a starting model that a recipe compares its policy with: dpo and kto's reference model
(lathe.llm.preference.reference chooses which) and ASFT's reference (lathe.llm.methods.losses), loaded the
same way: a copy of the model arguments in the precision the policy computes in, through load_model with
is_trainable=False. Also the two switches such a comparison needs: dropout off and gradients off."""

from __future__ import annotations

import copy

import torch
from torch import nn


def load_frozen_copy(
    tokenizer,
    model_args,
    finetuning_type: str,
    model_name_or_path: str | None = None,
    adapters: list[str] | None = None,
    from_scratch: bool | None = None,
) -> nn.Module:
    """The starting model (or `model_name_or_path` with `adapters`), frozen, in the policy's compute dtype.

    finetuning_type "lora" merges every adapter listed in adapter_name_or_path into the weights; "full"
    loads the weights as they are. from_scratch None keeps model_args' train_from_scratch."""
    from lathe.llm.config.train import FinetuningArguments
    from lathe.llm.model.loader import load_model

    frozen_args = copy.copy(model_args)
    # The frozen weights in the precision the policy computes in (its own frozen weights are loaded so).
    frozen_args.infer_dtype = model_args.compute_dtype or "float32"
    if from_scratch is not None:
        frozen_args.train_from_scratch = from_scratch
    if model_name_or_path is not None:
        frozen_args.model_name_or_path = model_name_or_path
        frozen_args.adapter_name_or_path = adapters
    return load_model(tokenizer, frozen_args, FinetuningArguments(finetuning_type=finetuning_type), is_trainable=False)


def disable_dropout(model: nn.Module | None) -> None:
    """Dropout off in every module (TRL's disable_dropout_in_model): the policy and reference log-probs of
    one batch must be comparable, so dpo, kto (and GRPO with disable_dropout) train without dropout."""
    if model is None:
        return
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0


@torch.no_grad()
def frozen(model: nn.Module) -> nn.Module:
    """No gradients and evaluation mode: a reference model is only ever run forward."""
    model.requires_grad_(False)
    model.eval()
    return model
