"""Which parts of a vision-language model train, as LLaMA-Factory 0.9.5 decides it (model/model_utils/visual.py):
freeze_vision_tower / freeze_multi_modal_projector / freeze_language_model freeze the family's name parts in full
and freeze tuning, and LoRA never wraps a frozen part nor the family's conflicting modules (a patch embedding)."""

from __future__ import annotations

import logging

from lathe.llm.multimodal.base import Composite

logger = logging.getLogger(__name__)
TOWER_DEFAULTS = {"freeze_vision_tower": True, "freeze_multi_modal_projector": True, "freeze_language_model": False}


def composite_of(model) -> Composite | None:
    """The Composite of the model's type among the registered families (None for a text model)."""
    from lathe.llm.multimodal import plugins

    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    for name in plugins.FAMILIES:
        found = plugins.plugin_class(name).composites or {}
        if model_type in found:
            return found[model_type]
    return None


def is_vision_language(model) -> bool:
    """A model of a registered family: one with a Composite, or one LLaMA-Factory trains whole (LFM2-VL, ERNIE-4.5-VL:
    no composite, yet their batches need the media tensors and their runs save the processor)."""
    from lathe.llm.multimodal import plugins

    if composite_of(model) is not None:
        return True
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return any(model_type in plugins.plugin_class(name).whole_model_types for name in plugins.FAMILIES)


def forbidden_keys(composite: Composite, args) -> set[str]:
    return composite.frozen_keys(
        args.freeze_vision_tower, args.freeze_multi_modal_projector, args.freeze_language_model
    )


def freeze_towers(model, args, method: str) -> None:
    """full: the forbidden parts stop training; freeze: the projector trains too when not frozen, then the
    forbidden parts stop. A text model is left as it is."""
    composite = composite_of(model)
    if composite is None:
        changed = [key for key, default in TOWER_DEFAULTS.items() if getattr(args, key, default) != default]
        if changed:  # LLaMA-Factory ignores them here too; say so
            logger.warning(
                "%s: %s is not a vision-language model: nothing to freeze", ", ".join(changed), type(model).__name__
            )
        return
    forbidden = forbidden_keys(composite, args)
    for name, parameter in model.named_parameters():
        if method == "freeze" and not args.freeze_multi_modal_projector:
            if any(key in name for key in composite.projector_keys):
                parameter.requires_grad_(True)
        if any(key in name for key in forbidden):
            parameter.requires_grad_(False)
    logger.info("Vision-language model: not trained: %s", ", ".join(sorted(forbidden)) or "nothing")


def all_linear_forbidden(composite: Composite, args) -> set[str]:
    """What lora_target: all leaves out (LLaMA-Factory's find_all_linear_modules): the projector always, the
    vision tower when frozen."""
    keys = set(composite.projector_keys)
    if args.freeze_vision_tower:
        keys.update(composite.vision_keys)
    return keys


def patch_targets(model, args, targets: list[str], all_linear: bool) -> list[str]:
    """LLaMA-Factory's patch_target_modules: the full names of the modules whose name holds a target and no
    forbidden part nor conflicting key. A text model keeps `targets`."""
    composite = composite_of(model)
    if composite is None:
        return targets
    if all_linear:
        skip = all_linear_forbidden(composite, args) | {"lm_head"}
        targets = sorted(
            {
                name.split(".")[-1]
                for name, module in model.named_modules()
                if not any(key in name for key in skip)
                and "Linear" in type(module).__name__  # by class name (layers.find_all_linear_modules says why)
                and "Embedding" not in type(module).__name__
            }
        )
    forbidden = forbidden_keys(composite, args) | set(composite.lora_conflict_keys)
    return [
        name
        for name, _ in model.named_modules()
        if any(target in name for target in targets) and not any(key in name for key in forbidden)
    ]
