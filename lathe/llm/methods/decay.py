"""Which parameters LLaMA-Factory's own optimizers (LoRA+, GaLore, APOLLO, BAdam) decay: the one rule they share."""

from __future__ import annotations

import torch


def llamafactory_decay_names(model) -> set[str]:
    """Parameters LLaMA-Factory's own optimizers decay: all but biases and those inside an nn.LayerNorm.
    Unlike the Trainer's rule (lathe.train.optim.optimizers.get_decay_parameter_names), RMSNorm weights are decayed."""
    inside_layer_norm = set()
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm):
            inside_layer_norm.update(
                f"{module_name}.{name}" if module_name else name for name, _ in module.named_parameters()
            )
    return {name for name, _ in model.named_parameters() if name not in inside_layer_norm and "bias" not in name}
