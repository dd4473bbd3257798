"""The reference model of dpo and kto: which model it is, and how its log-probs are computed.

- `ref_model` given: that folder (with `ref_model_adapters` merged), frozen.
- LoRA without `ref_model`: none is loaded; the policy with its adapter switched off is the reference
  (no second copy of the weights in memory).
- full / freeze without `ref_model`: a frozen copy of the starting model (with adapter_name_or_path merged).
- dpo with orpo / simpo: no reference at all.
This is LLaMA-Factory 0.9.5's choice (create_ref_model), except that lathe loads the reference with the
policy's tokenizer, so tokens a template added exist in both.
"""

from __future__ import annotations

import contextlib
import logging

from torch import nn

logger = logging.getLogger(__name__)


def needs_reference(finetuning_args) -> bool:
    return finetuning_args.stage == "kto" or finetuning_args.use_ref_model


def reference_kind(finetuning_args, do_train: bool) -> str:
    """What the reference costs in memory: "copy" (a frozen model is loaded), "adapter" (the policy with
    its LoRA adapter off: no second copy), "itself" (evaluation only) or "none"."""
    if not needs_reference(finetuning_args):
        return "none"
    if finetuning_args.ref_model is not None:
        return "copy"
    if not do_train:
        return "itself"
    return "adapter" if finetuning_args.finetuning_type == "lora" else "copy"


def describe_reference(finetuning_args, do_train: bool) -> str | None:
    """The plan's line: what dpo / kto compare the policy with (None for the other stages)."""
    if finetuning_args.stage == "dpo" and not finetuning_args.use_ref_model:
        return f"none ({finetuning_args.pref_loss} compares the chosen and rejected answers only)"
    if not needs_reference(finetuning_args):
        return None
    if finetuning_args.ref_model is not None:
        adapters = finetuning_args.ref_model_adapters
        return f"{finetuning_args.ref_model}" + (f" + {', '.join(adapters)}" if adapters else "") + " (frozen)"
    if not do_train:
        return "the model itself (evaluation only: rewards are left out)"
    if finetuning_args.finetuning_type == "lora":
        return "the model with its LoRA adapter switched off (no second copy)"
    return "a frozen copy of the starting model"


def create_reference_model(tokenizer, model_args, finetuning_args) -> nn.Module | None:
    """The frozen reference model to load for training, or None (the adapter-less policy, or no reference)."""
    if not needs_reference(finetuning_args):
        return None
    if finetuning_args.ref_model is None and finetuning_args.finetuning_type == "lora":
        return None
    from lathe.llm.model.frozen import load_frozen_copy

    given = finetuning_args.ref_model
    adapters = finetuning_args.ref_model_adapters if given is not None else None
    # finetuning_type lora with is_trainable=False: every adapter listed is merged into the weights.
    model = load_frozen_copy(tokenizer, model_args, "lora", given, adapters, from_scratch=False)
    name = given if given is not None else model_args.model_name_or_path
    adapters = adapters if given is not None else model_args.adapter_name_or_path
    logger.info("Reference model: %s%s (frozen copy)", name, f" + {', '.join(adapters)}" if adapters else "")
    return model


def reference_context(policy: nn.Module, reference: nn.Module | None):
    """(the module to run, a context to run it in) for the reference log-probs: a frozen reference
    model as is, or the policy with its LoRA adapter switched off."""
    if reference is not None:
        return reference, contextlib.nullcontext()
    if not hasattr(policy, "disable_adapter"):
        raise ValueError(
            f"{type(policy).__name__} has no adapter to switch off: a reference model is needed "
            "(set ref_model, or train with finetuning_type: lora)."
        )
    return None, policy.disable_adapter()


def shard_reference_like_policy(reference: nn.Module, args) -> nn.Module:
    """Under FSDP2 the reference is sharded as the policy is (its forward gathers each block in turn);
    under DDP and DeepSpeed every process holds the whole frozen reference."""
    from lathe.train.parallel import distributed
    from lathe.train.parallel.fsdp import settings_from_args, shard_model

    settings = settings_from_args(args) if distributed.is_distributed() and not args.deepspeed else None
    if settings is None:
        return reference
    return shard_model(reference, args, settings)
