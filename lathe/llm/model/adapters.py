"""The fine-tuning methods: which parameters train. full (all), freeze (chosen hidden layers and
modules, or LLaMA Pro's expanded blocks), lora / oft (peft adapters, lathe.llm.model.lora)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lathe.llm.model.layers import OUTPUT_HEAD_NAMES, find_all_linear_modules, find_layer_stack

if TYPE_CHECKING:
    from lathe.llm.config.train import FinetuningArguments, ModelArguments

__all__ = [
    "init_adapter",
    "count_parameters",
    "find_all_linear_modules",
    "find_layer_stack",
    "describe_trainable",
    "OUTPUT_HEAD_NAMES",
]

logger = logging.getLogger(__name__)


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts; shared (tied) tensors count once, packed 4-bit weights as
    the elements they stand for."""
    from lathe.llm.model.quantization import parameter_count

    seen, trainable, total = set(), 0, 0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        count = parameter_count(param)
        total += count
        if param.requires_grad:
            trainable += count
    return trainable, total


def describe_trainable(model) -> str:
    trainable, total = count_parameters(model)
    return (
        f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {100 * trainable / max(total, 1):.4f}"
    )


def init_adapter(model, model_args: "ModelArguments", finetuning_args: "FinetuningArguments", is_trainable: bool):
    """Apply finetuning_type; returns the model (a peft PeftModel for lora, the same object otherwise).

    Trainable parameters are kept in float32 (the optimizer's master copy) unless pure_bf16.
    """
    from lathe.llm.model.quantization import is_quantized

    method = finetuning_args.finetuning_type
    if is_trainable and is_quantized(model) and method not in ("lora", "oft"):
        raise ValueError(f"A quantized model trains adapters only: set finetuning_type lora or oft (got {method!r}).")
    if method in ("lora", "oft"):
        from lathe.llm.model.lora import setup_peft

        model = setup_peft(model, model_args, finetuning_args, is_trainable)
    elif not is_trainable:
        return model
    elif method == "freeze":
        _setup_freeze(model, finetuning_args)
    elif method != "full":
        raise ValueError(f"finetuning_type {method!r} is not supported; lathe supports full, freeze, lora, oft.")
    if is_trainable and method in ("full", "freeze"):
        from lathe.llm.multimodal.towers import freeze_towers

        freeze_towers(model, finetuning_args, method)
    if is_trainable and not finetuning_args.pure_bf16:
        import torch

        for param in model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.to(torch.float32)
    if is_trainable:
        logger.info("Fine-tuning method: %s", method)
    return model


# ----------------------------------------------------------------------------------------------
# freeze


def _setup_freeze(model, finetuning_args: "FinetuningArguments") -> None:
    stack, num_layers = find_layer_stack(model)
    count = finetuning_args.freeze_trainable_layers
    if count == 0:
        raise ValueError(
            "freeze_trainable_layers must be non-zero: n > 0 trains the last n layers, n < 0 the first -n."
        )
    if finetuning_args.use_llama_pro:
        from lathe.llm.model.llama_pro import expanded_layer_ids

        layer_ids = expanded_layer_ids(num_layers, count)
    elif count > 0:
        layer_ids = range(max(0, num_layers - count), num_layers)
    else:
        layer_ids = range(min(-count, num_layers))

    names = [name for name, _ in model.named_parameters()]
    layer_zero = f"{stack}.0."
    inside_layer = {name[len(layer_zero) :] for name in names if name.startswith(layer_zero)}
    trainable_prefixes = []
    for module in finetuning_args.freeze_trainable_modules:
        if module != "all" and not any(path == module or path.startswith(module + ".") for path in inside_layer):
            choices = sorted({path.split(".")[0] for path in inside_layer})
            raise ValueError(
                f"freeze_trainable_modules: no module {module!r} in the hidden layers; choose from {', '.join(choices)} or all."
            )
        suffix = "" if module == "all" else module + "."
        trainable_prefixes += [f"{stack}.{index}.{suffix}" for index in layer_ids]

    # An extra module is named by the module holding a parameter outside the hidden layers (embed_tokens,
    # norm, lm_head) and, as in LLaMA-Factory, trains every parameter whose name contains it: "norm" is
    # the final norm and each layer's input_layernorm / post_attention_layernorm.
    outside = {name.split(".")[-2] for name in names if not name.startswith(stack + ".") and "." in name}
    extra = finetuning_args.freeze_extra_modules or []
    for module in extra:
        if module not in outside:
            raise ValueError(
                f"freeze_extra_modules: no module {module!r} outside the hidden layers; choose from {', '.join(sorted(outside))}."
            )

    for name, param in model.named_parameters():
        param.requires_grad_(
            any(name.startswith(prefix) for prefix in trainable_prefixes) or any(module in name for module in extra)
        )
    logger.info(
        "freeze: training layers %s of %s (%s)",
        list(layer_ids),
        stack,
        ",".join(finetuning_args.freeze_trainable_modules),
    )
