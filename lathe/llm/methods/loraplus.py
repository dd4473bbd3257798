"""LoRA+ (loraplus_lr_ratio): the optimizer with LLaMA-Factory's four parameter groups, the B matrices
learning loraplus_lr_ratio times faster than the A matrices (Hayou et al., 2024); and the mixin that gives
every recipe's Trainer (pt, sft, rm, dpo, kto) the `create_optimizer` that builds it."""

from __future__ import annotations

import logging

__all__ = ["MethodOptimizerMixin", "create_loraplus_optimizer", "loraplus_parameter_groups"]

logger = logging.getLogger(__name__)


def _decay_parameter_names(model) -> set[str]:
    """LLaMA-Factory's rule for LoRA+: every parameter decays except those of nn.LayerNorm modules and biases."""
    import torch

    names = set()
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm):
            continue
        for name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if "bias" not in full:
                names.add(full)
    return names


def loraplus_parameter_groups(
    model, learning_rate: float, weight_decay: float, lr_ratio: float, embedding_lr: float
) -> list[dict]:
    """[A and the other matrices at learning_rate, B (and every vector: biases, DoRA magnitudes) at
    learning_rate x lr_ratio with and without decay, embedding adapters' B at embedding_lr]; empty
    groups are kept so the group order (and param_groups[0], whose rate is logged) is always the same."""
    decay = _decay_parameter_names(model)
    groups = {"lora_a": [], "lora_b": [], "lora_b_nodecay": [], "embedding": []}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if "lora_embedding_B" in name:
            groups["embedding"].append(param)
        elif "lora_B" in name or param.ndim == 1:
            groups["lora_b" if name in decay else "lora_b_nodecay"].append(param)
        else:
            groups["lora_a"].append(param)
    return [
        {"params": groups["lora_a"], "lr": learning_rate, "weight_decay": weight_decay},
        {"params": groups["lora_b"], "lr": learning_rate * lr_ratio, "weight_decay": weight_decay},
        {"params": groups["lora_b_nodecay"], "lr": learning_rate * lr_ratio, "weight_decay": 0.0},
        {"params": groups["embedding"], "lr": embedding_lr, "weight_decay": weight_decay},
    ]


def create_loraplus_optimizer(model, training_args, finetuning_args):
    """The optimizer `optim` names (with its arguments), over LoRA+'s parameter groups."""
    from lathe.train.optim.optimizers import get_optimizer_cls_and_kwargs

    optimizer_cls, kwargs = get_optimizer_cls_and_kwargs(training_args, model)
    groups = loraplus_parameter_groups(
        model,
        training_args.learning_rate,
        training_args.weight_decay,
        finetuning_args.loraplus_lr_ratio,
        finetuning_args.loraplus_lr_embedding,
    )
    logger.info("LoRA+ optimizer: B matrices at %g x the learning rate.", finetuning_args.loraplus_lr_ratio)
    return optimizer_cls(groups, **dict(kwargs))


class MethodOptimizerMixin:
    """Mixed into the recipes' Trainers (before the Trainer class): `create_optimizer` builds the
    optimizer a fine-tuning method needs (LoRA+'s parameter groups, GaLore, APOLLO, BAdam, Adam-mini,
    Muon: lathe.llm.methods.optimizers), and otherwise the Trainer's own.
    Reads `self.finetuning_args`, set by the `finetuning_args=` argument or by the subclass."""

    finetuning_args = None

    def __init__(self, *args, finetuning_args=None, **kwargs):
        if finetuning_args is not None:
            self.finetuning_args = finetuning_args
        super().__init__(*args, **kwargs)

    def create_optimizer(self, model=None):
        if self.optimizer is None and self.finetuning_args is not None:
            from lathe.llm.methods.optimizers import create_custom_optimizer

            self.optimizer = create_custom_optimizer(model or self.model, self.args, self.finetuning_args)
        return super().create_optimizer(model)
