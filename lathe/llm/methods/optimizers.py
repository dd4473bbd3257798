"""LLaMA-Factory's optimizer keys -> the optimizer the Trainer uses: GaLore, APOLLO (each optionally layer-wise),
LoRA+ (lathe.llm.methods.loraplus), BAdam (layer or ratio mode), Adam-mini and Muon, built as LLaMA-Factory 0.9.5 builds them (the same parameter
groups, in the same order, with the same options), so that the same config gives the same numbers.

`create_custom_optimizer` (called by every recipe's Trainer through MethodOptimizerMixin below, in
LLaMA-Factory's order) returns None when no such key is set: the Trainer then builds `optim` as usual.
"""

from __future__ import annotations

import logging

import torch

from lathe.llm.methods.decay import llamafactory_decay_names
from lathe.llm.methods.loraplus import create_loraplus_optimizer
from lathe.train.optim.optimizers import get_optimizer_cls_and_kwargs

__all__ = ["MethodOptimizerMixin", "create_custom_optimizer"]

logger = logging.getLogger(__name__)

# `optim` names whose update GaLore / APOLLO can stand in for. LLaMA-Factory 0.9.5 accepts only adamw_torch
# (and raises NotImplementedError for transformers 5's default, adamw_torch_fused, whose update is the same).
_GALORE_KINDS = {
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw",
    "adamw_bnb_8bit": "adamw_8bit",
    "adamw_8bit": "adamw_8bit",
    "paged_adamw_8bit": "adamw_8bit",
    "adafactor": "adafactor",
}
_APOLLO_OPTIMS = ("adamw_torch", "adamw_torch_fused")


def create_custom_optimizer(model, training_args, finetuning_args):
    """The optimizer LLaMA-Factory's keys ask for, or None."""
    if finetuning_args.use_galore:
        return _create_low_rank(model, training_args, finetuning_args, "galore")
    if finetuning_args.use_apollo:
        return _create_low_rank(model, training_args, finetuning_args, "apollo")
    if getattr(finetuning_args, "loraplus_lr_ratio", None) is not None:
        return create_loraplus_optimizer(model, training_args, finetuning_args)
    if finetuning_args.use_badam:
        return _create_badam(model, training_args, finetuning_args)
    if finetuning_args.use_adam_mini:
        return _create_adam_mini(model, training_args)
    if finetuning_args.use_muon:
        return _create_muon(model, training_args)
    return None


def _decay_split(model, exclude: set[int] = frozenset()) -> tuple[list, list]:
    """(decay, no-decay) trainable parameters outside `exclude` (ids), in model order."""
    decay_names = llamafactory_decay_names(model)
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad and id(parameter) not in exclude:
            (decay if name in decay_names else no_decay).append(parameter)
    return decay, no_decay


def _optim_name(training_args) -> str:
    return str(getattr(training_args.optim, "value", training_args.optim))


def _low_rank_targets(model, targets: list[str]) -> list[torch.nn.Parameter]:
    """Weights of the nn.Linear modules whose name contains a target (all: every linear layer's short name)."""
    if targets == ["all"]:
        from lathe.llm.model.layers import find_all_linear_modules

        targets = find_all_linear_modules(model)
    chosen = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and any(target in name for target in targets):
            chosen.extend(p for p in module.parameters() if p.requires_grad and p.ndim > 1)
    return chosen


def _create_low_rank(model, training_args, finetuning_args, method: str):
    """GaLore or APOLLO: no-decay, decay, then the projected weights (with decay) as a third group."""
    from lathe.train.optim import apollo, galore

    optim = _optim_name(training_args)
    f = finetuning_args
    if method == "galore":
        if optim not in _GALORE_KINDS:
            raise ValueError(f"use_galore works with optim {', '.join(_GALORE_KINDS)}; got optim: {optim}.")
        if _GALORE_KINDS[optim] == "adamw_8bit" and any(p.device.type != "cuda" for p in model.parameters()):
            raise ValueError(
                f"use_galore with optim: {optim} uses bitsandbytes' 8-bit AdamW, which runs on CUDA GPUs only."
            )
        optimizer_cls = galore.optimizer_class(_GALORE_KINDS[optim], "use_galore")
        options = galore.group_options(f.galore_rank, f.galore_update_interval, f.galore_scale, f.galore_proj_type)
        targets, layerwise = f.galore_target, f.galore_layerwise
    else:
        if optim not in _APOLLO_OPTIMS:
            raise ValueError(f"use_apollo works with optim adamw_torch or adamw_torch_fused; got optim: {optim}.")
        optimizer_cls = apollo.optimizer_class("use_apollo")
        # apollo_scale_front is a constructor argument of APOLLOAdamW: LLaMA-Factory 0.9.5 puts it in the param
        # group, where apollo-torch never reads it; here it takes effect.
        options = apollo.group_options(
            f.apollo_rank,
            f.apollo_proj,
            f.apollo_proj_type,
            f.apollo_update_interval,
            f.apollo_scale,
            f.apollo_scale_type,
        )
        targets, layerwise = f.apollo_target, f.apollo_layerwise
    projected = _low_rank_targets(model, targets)
    decay, no_decay = _decay_split(model, exclude={id(p) for p in projected})
    kwargs = _base_kwargs(training_args, optim)
    if method == "apollo" and f.apollo_scale_front:
        kwargs["scale_front"] = True
    groups = [
        {"params": no_decay, "weight_decay": 0.0},
        {"params": decay, "weight_decay": training_args.weight_decay},
        {"params": projected, "weight_decay": training_args.weight_decay, **options},
    ]
    logger.info("Using %s with %s on %d matrices.", method.upper(), options, len(projected))
    if layerwise:
        from lathe.train.optim.layerwise import PerParameter

        logger.warning("Layer-wise %s steps in the backward pass: the logged grad_norm is 0.", method.upper())
        return PerParameter(optimizer_cls)(groups, **kwargs)
    return optimizer_cls(groups, **kwargs)


def _base_kwargs(training_args, optim: str) -> dict:
    """The constructor kwargs transformers gives `optim` (lr, betas, eps; Adafactor's switches; bitsandbytes'
    bits and paging), less torch's choice of kernel (fused), which GaLore and APOLLO do not take."""
    if optim == "adafactor":
        return {"lr": training_args.learning_rate, "scale_parameter": False, "relative_step": False}
    kwargs = {
        "lr": training_args.learning_rate,
        "betas": (training_args.adam_beta1, training_args.adam_beta2),
        "eps": training_args.adam_epsilon,
    }
    if "8bit" in optim:
        kwargs.update(optim_bits=8, is_paged="paged" in optim)
    return kwargs


def _create_badam(model, training_args, finetuning_args):
    from lathe.train.optim import badam

    f = finetuning_args
    decay, no_decay = _decay_split(model)
    groups = [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": training_args.weight_decay}]
    named = list(model.named_parameters())
    if f.badam_mode == "layer":
        optimizer_cls, kwargs = get_optimizer_cls_and_kwargs(training_args, model)
        return badam.create_block_optimizer(
            optimizer_cls(groups, **kwargs),
            named,
            f.badam_switch_interval,
            f.badam_start_block,
            f.badam_switch_mode,
            f.badam_verbose,
        )
    kwargs = _base_kwargs(training_args, "adamw_torch")
    return badam.create_ratio_optimizer(
        groups,
        named,
        f.badam_update_ratio,
        f.badam_mask_mode,
        f.badam_verbose,
        lr=kwargs["lr"],
        betas=kwargs["betas"],
        eps=kwargs["eps"],
    )


def _model_is_sharded(training_args) -> bool:
    if training_args.fsdp:
        return True
    if training_args.deepspeed:
        from lathe.train.parallel import deepspeed_zero

        return deepspeed_zero.zero_stage(deepspeed_zero.read_config(training_args.deepspeed)) == 3
    return False


def _create_adam_mini(model, training_args):
    from lathe.train.optim.adam_mini import create_adam_mini

    return create_adam_mini(
        model,
        lr=training_args.learning_rate,
        betas=(training_args.adam_beta1, training_args.adam_beta2),
        eps=training_args.adam_epsilon,
        weight_decay=training_args.weight_decay,
        model_sharding=_model_is_sharded(training_args),
    )


def _create_muon(model, training_args):
    """Muon for trainable 2-D weights other than embeddings and the head; AdamW (inside Muon) for the rest."""
    from lathe.train.optim.muon import Muon

    muon, adamw = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            use_muon = parameter.ndim == 2 and "embed" not in name and "lm_head" not in name
            (muon if use_muon else adamw).append(parameter)
    logger.info("Using Muon on %d matrices and AdamW on %d other parameters.", len(muon), len(adamw))
    return Muon(
        lr=training_args.learning_rate,
        wd=training_args.weight_decay,
        muon_params=muon,
        adamw_params=adamw,
        adamw_betas=(training_args.adam_beta1, training_args.adam_beta2),
        adamw_eps=training_args.adam_epsilon,
    )


class MethodOptimizerMixin:
    """Mixed into the recipes' Trainers (before the Trainer class): `create_optimizer` builds the
    optimizer a fine-tuning method needs (LoRA+'s parameter groups, GaLore, APOLLO, BAdam, Adam-mini,
    Muon: create_custom_optimizer above), and otherwise the Trainer's own.
    Reads `self.finetuning_args`, set by the `finetuning_args=` argument or by the subclass."""

    finetuning_args = None

    def __init__(self, *args, finetuning_args=None, **kwargs):
        if finetuning_args is not None:
            self.finetuning_args = finetuning_args
        super().__init__(*args, **kwargs)

    def create_optimizer(self, model=None):
        if self.optimizer is None and self.finetuning_args is not None:
            self.optimizer = create_custom_optimizer(model or self.model, self.args, self.finetuning_args)
        return super().create_optimizer(model)
