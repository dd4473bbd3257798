"""LoRA+ (loraplus_lr_ratio): the optimizer with LLaMA-Factory's four parameter groups, the B matrices
learning loraplus_lr_ratio times faster than the A matrices (Hayou et al., 2024). The recipes' Trainers reach
it through MethodOptimizerMixin (lathe.llm.methods.optimizers)."""

from __future__ import annotations

import logging

from lathe.llm.methods.decay import llamafactory_decay_names

__all__ = ["create_loraplus_optimizer", "loraplus_parameter_groups"]

logger = logging.getLogger(__name__)


def loraplus_parameter_groups(
    model, learning_rate: float, weight_decay: float, lr_ratio: float, embedding_lr: float
) -> list[dict]:
    """[A and the other matrices at learning_rate, B (and every vector: biases, DoRA magnitudes) at
    learning_rate x lr_ratio with and without decay, embedding adapters' B at embedding_lr]; empty
    groups are kept so the group order (and param_groups[0], whose rate is logged) is always the same."""
    decay = llamafactory_decay_names(model)
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
