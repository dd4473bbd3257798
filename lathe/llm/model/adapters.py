"""The fine-tuning methods: which parameters train. full (all), freeze (chosen hidden layers and
modules), lora (peft adapters, so they save as standard adapter_model.safetensors + adapter_config.json)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lathe.llm.config import FinetuningArguments, ModelArguments

__all__ = ["init_adapter", "count_parameters", "find_all_linear_modules", "find_layer_stack", "describe_trainable"]

logger = logging.getLogger(__name__)

# Output heads that are not called lm_head in some families (LLaMA-Factory excludes the same ones).
OUTPUT_HEAD_NAMES = {"lm_head", "output_layer", "output", "embed_out"}


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts; shared (tied) tensors count once."""
    seen, trainable, total = set(), 0, 0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        total += param.numel()
        if param.requires_grad:
            trainable += param.numel()
    return trainable, total


def describe_trainable(model) -> str:
    trainable, total = count_parameters(model)
    return f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {100 * trainable / max(total, 1):.4f}"


def init_adapter(model, model_args: "ModelArguments", finetuning_args: "FinetuningArguments", is_trainable: bool):
    """Apply finetuning_type; returns the model (a peft PeftModel for lora, the same object otherwise).

    Trainable parameters are kept in float32 (the optimizer's master copy) unless pure_bf16.
    """
    method = finetuning_args.finetuning_type
    if method == "lora":
        model = _setup_lora(model, model_args, finetuning_args, is_trainable)
    elif not is_trainable:
        return model
    elif method == "freeze":
        _setup_freeze(model, finetuning_args)
    elif method != "full":
        raise ValueError(f"finetuning_type {method!r} is not supported yet; lathe supports full, freeze, lora.")
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


def find_layer_stack(model) -> tuple[str, int]:
    """(qualified name, length) of the model's hidden-layer ModuleList, e.g. ("model.layers", 32)."""
    import torch

    config = getattr(model.config, "text_config", None) or model.config
    num_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers", None) or getattr(config, "n_layer", None)
    if not num_layers:
        raise ValueError(f"freeze: {type(model).__name__}'s config does not say how many hidden layers it has.")
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return name, num_layers
    raise ValueError(f"freeze: found no list of {num_layers} hidden layers in {type(model).__name__}.")


def _setup_freeze(model, finetuning_args: "FinetuningArguments") -> None:
    stack, num_layers = find_layer_stack(model)
    count = finetuning_args.freeze_trainable_layers
    if count == 0:
        raise ValueError("freeze_trainable_layers must be non-zero: n > 0 trains the last n layers, n < 0 the first -n.")
    if count > 0:
        layer_ids = range(max(0, num_layers - count), num_layers)
    else:
        layer_ids = range(min(-count, num_layers))

    names = [name for name, _ in model.named_parameters()]
    layer_zero = f"{stack}.0."
    inside_layer = {name[len(layer_zero):] for name in names if name.startswith(layer_zero)}
    trainable_prefixes = []
    for module in finetuning_args.freeze_trainable_modules:
        if module != "all" and not any(path == module or path.startswith(module + ".") for path in inside_layer):
            choices = sorted({path.split(".")[0] for path in inside_layer})
            raise ValueError(f"freeze_trainable_modules: no module {module!r} in the hidden layers; choose from {', '.join(choices)} or all.")
        suffix = "" if module == "all" else module + "."
        trainable_prefixes += [f"{stack}.{index}.{suffix}" for index in layer_ids]

    outside = [name for name in names if not name.startswith(stack + ".")]
    for module in finetuning_args.freeze_extra_modules or []:
        # Match whole name components: "norm" means the final norm, not every layer's input_layernorm.
        matches = [name for name in outside if module in name.split(".")[:-1]]
        if not matches:
            choices = sorted({name.split(".")[-2] for name in outside if "." in name})
            raise ValueError(f"freeze_extra_modules: no module {module!r} outside the hidden layers; choose from {', '.join(choices)}.")
        trainable_prefixes += matches

    for name, param in model.named_parameters():
        param.requires_grad_(any(name.startswith(prefix) for prefix in trainable_prefixes))
    logger.info("freeze: training layers %s of %s (%s)", list(layer_ids), stack, ",".join(finetuning_args.freeze_trainable_modules))


# ----------------------------------------------------------------------------------------------
# lora


def find_all_linear_modules(model) -> list[str]:
    """Short names of every linear layer except the output head (lora_target: all)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = set()
    for name, module in model.named_modules():
        short = name.split(".")[-1]
        if module is head or short in OUTPUT_HEAD_NAMES:
            continue
        is_linear = isinstance(module, torch.nn.Linear) or "Linear" in type(module).__name__
        if is_linear and "Embedding" not in type(module).__name__:
            names.add(short)
    if not names:
        raise ValueError(f"lora_target: all found no linear layers in {type(model).__name__}.")
    return sorted(names)


def _check_targets(model, targets: list[str], key: str) -> None:
    available = {name.split(".")[-1] for name, _ in model.named_modules()}
    qualified = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if t not in available and not any(q.endswith("." + t) or q == t for q in qualified)]
    if missing:
        raise ValueError(f"{key}: no module named {', '.join(missing)}; linear layers here: {', '.join(find_all_linear_modules(model))}.")


def _setup_lora(model, model_args: "ModelArguments", finetuning_args: "FinetuningArguments", is_trainable: bool):
    from pathlib import Path

    from peft import LoraConfig, PeftModel, TaskType, get_peft_model

    adapters = list(model_args.adapter_name_or_path or [])
    for adapter in adapters:
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise FileNotFoundError(f"adapter_name_or_path: {adapter!r} has no adapter_config.json (a peft LoRA adapter folder is expected).")
    # Training continues the last adapter unless create_new_adapter; everything else is merged in.
    resume = adapters[-1] if adapters and is_trainable and not finetuning_args.create_new_adapter else None
    to_merge = adapters[:-1] if resume else adapters
    for adapter in to_merge:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    if to_merge:
        logger.info("Merged %d adapter(s): %s", len(to_merge), ",".join(to_merge))
    if resume is not None:
        logger.info("Continuing training of the adapter in %s", resume)
        return PeftModel.from_pretrained(model, resume, is_trainable=True)
    if not is_trainable:
        return model

    if finetuning_args.lora_target == ["all"]:
        targets = find_all_linear_modules(model)
    else:
        targets = list(finetuning_args.lora_target)
        _check_targets(model, targets, "lora_target")
    if finetuning_args.additional_target:
        _check_targets(model, finetuning_args.additional_target, "additional_target")
    if model_args.resize_vocab and finetuning_args.additional_target is None:
        # New token rows must train, or the added tokens keep their initial embeddings.
        finetuning_args.additional_target = sorted({
            name.split(".")[-1] for name, module in model.named_modules()
            if module is model.get_input_embeddings() or module is model.get_output_embeddings()
        })
        logger.info("resize_vocab: training %s in full with the adapter.", ",".join(finetuning_args.additional_target))
    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM, inference_mode=False, r=finetuning_args.lora_rank,
        lora_alpha=finetuning_args.lora_alpha, lora_dropout=finetuning_args.lora_dropout, target_modules=targets,
        use_rslora=finetuning_args.use_rslora, use_dora=finetuning_args.use_dora,
        modules_to_save=finetuning_args.additional_target,
    )
    logger.info("LoRA on %s (rank %d, alpha %d)", ",".join(targets), finetuning_args.lora_rank, finetuning_args.lora_alpha)
    return get_peft_model(model, config)
