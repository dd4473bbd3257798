"""LoRA and OFT adapters through peft, as LLaMA-Factory builds them: continuing or merging
adapter_name_or_path, target discovery (all, names, a regular expression, LLaMA Pro's expanded blocks),
rsLoRA, DoRA, PiSSA initialisation, additional_target; OFT with its block keys. Adapters save in peft's
format (adapter_model.safetensors + adapter_config.json)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

from lathe.llm.model.layers import find_all_linear_modules

if TYPE_CHECKING:
    from lathe.llm.config.train import FinetuningArguments, ModelArguments

__all__ = ["setup_peft", "resolve_targets", "import_peft"]

logger = logging.getLogger(__name__)


def import_peft():
    """`import peft`, without what bitsandbytes logs when peft imports it (peft.helpers does, whenever it
    is installed): on a CPU, a warning about a missing kernel for 4-bit layers that a run without
    quantization never builds. A quantized run imported bitsandbytes earlier, while loading the model
    (lathe.llm.model.quantization), and saw its warnings then."""
    import sys
    import warnings

    if "peft" in sys.modules or "bitsandbytes" in sys.modules:
        import peft

        return peft
    quiet = logging.getLogger("bitsandbytes")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="bitsandbytes")
            import peft
    finally:
        quiet.setLevel(level)
    return peft


def setup_peft(model, model_args: "ModelArguments", finetuning_args: "FinetuningArguments", is_trainable: bool):
    """The model with its adapters: earlier ones merged, the last continued (or merged with
    create_new_adapter), or a new adapter when training without one to continue."""
    PeftModel = import_peft().PeftModel

    from lathe.llm.hub import adapter_folders
    from lathe.llm.model.quantization import is_quantized

    adapters = adapter_folders(model_args)
    for adapter in adapters:
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"adapter_name_or_path: {adapter!r} has no adapter_config.json (a peft adapter folder is expected)."
            )
    # Merging into quantized weights would round the update away: a quantized base keeps its (single) adapter apart.
    mergeable = not is_quantized(model)
    resume = (
        adapters[-1]
        if adapters and ((is_trainable and not finetuning_args.create_new_adapter) or not mergeable)
        else None
    )
    to_merge = adapters[:-1] if resume else adapters
    for adapter in to_merge:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    if to_merge:
        logger.info("Merged %d adapter(s): %s", len(to_merge), ",".join(to_merge))
    if resume is not None:
        logger.info("%s the adapter in %s", "Continuing training of" if is_trainable else "Loaded", resume)
        return PeftModel.from_pretrained(model, resume, is_trainable=is_trainable)
    if not is_trainable:
        return model
    return _new_adapter(model, model_args, finetuning_args)


def resolve_targets(model, finetuning_args: "FinetuningArguments"):
    """The target_modules peft gets: a list of names (or full module paths) or one regular expression."""
    oft = finetuning_args.finetuning_type == "oft"
    key = "oft_target" if oft else "lora_target"
    requested = finetuning_args.oft_target if oft else finetuning_args.lora_target
    if isinstance(requested, str):  # a regular expression, matched against whole module paths (peft's rule)
        if finetuning_args.use_llama_pro:
            raise ValueError(
                f"{key}: use_llama_pro picks the expanded blocks itself: give module names, not a regular expression."
            )
        if not any(re.fullmatch(requested, name) for name, _ in model.named_modules()):
            raise ValueError(
                f"{key}: the regular expression {requested!r} matches no module path "
                f"(paths look like {_example_path(model)!r})."
            )
        return requested
    targets = find_all_linear_modules(model) if requested == ["all"] else list(requested)
    if requested != ["all"]:
        _check_targets(model, targets, key)
    if finetuning_args.use_llama_pro:
        from lathe.llm.model.llama_pro import find_expanded_modules

        targets = find_expanded_modules(model, targets, finetuning_args.freeze_trainable_layers)
    from lathe.llm.multimodal.towers import patch_targets

    # a vision-language model: full module names, never a frozen tower nor the patch embedding (LLaMA-Factory)
    targets = patch_targets(model, finetuning_args, targets, requested == ["all"])
    if requested == ["all"]:
        _refuse_list_indexes(model, targets, key)
        _refuse_shared_names(model, targets, key)
    return targets


def _refuse_shared_names(model, targets: list[str], key: str) -> None:
    """`all` found a linear layer whose short name is also another module's (ERNIE-4.5-VL's resampler_model.mlp, a
    Linear, beside each decoder layer's Ernie4_5_VLMoeMLP): peft matches the name to both and stops on the MLP with a
    many-line "Target module ... is not supported". LLaMA-Factory 0.9.5 stops there too; this says so in one line."""
    import torch

    # what peft wraps besides linear layers (a patch embedding's Conv3d named like a linear layer is no clash)
    wrapped = (
        torch.nn.Linear,
        torch.nn.Embedding,
        torch.nn.Conv1d,
        torch.nn.Conv2d,
        torch.nn.Conv3d,
        torch.nn.MultiheadAttention,
    )
    short = {target for target in targets if "." not in target}
    clashes = [
        (name, type(module).__name__)
        for name, module in model.named_modules()
        if name.split(".")[-1] in short
        and "Linear" not in type(module).__name__
        and not isinstance(module, wrapped)
        and type(module).__name__ != "Conv1D"  # transformers' GPT-2 layer
    ]
    if not clashes:
        return
    names = sorted({name.split(".")[-1] for name, _ in clashes})
    named = [name for name in find_all_linear_modules(model) if name not in names]
    raise ValueError(
        f"{key}: all: {type(model).__name__} has linear layers named {', '.join(names)} as other modules are "
        f"({clashes[0][0]}: {clashes[0][1]}), which peft then targets and refuses (LLaMA-Factory 0.9.5 fails the same "
        f"way); name the target modules instead (linear layers here: {', '.join(named)})."
    )


def _refuse_list_indexes(model, targets: list[str], key: str) -> None:
    """`all` found a linear layer kept in a list (Gemma 3n's altup_projections.0): its name is the index, which peft
    (and LLaMA-Factory's tower filter, by substring) also matches to the decoder layer `layers.0`, and then refuses
    that layer in a many-line message. LLaMA-Factory 0.9.5 stops there too; this says so in one line. Full paths of
    linear layers in a list (a projector's `mlp.0`, picked by name) stay: peft matches them exactly."""

    def clashes(target: str) -> bool:  # a bare index matches every `*.0`; a full path, only a module that is no linear
        if not target.split(".")[-1].isdigit():
            return False
        return "." not in target or "Linear" not in type(model.get_submodule(target)).__name__

    if not any(clashes(target) for target in targets):
        return
    modules = model.named_modules()
    indexed = [name for name, module in modules if name.split(".")[-1].isdigit() and "Linear" in type(module).__name__]
    named = [name for name in find_all_linear_modules(model) if not name.isdigit()]
    raise ValueError(
        f"{key}: all: {type(model).__name__} keeps linear layers in lists ({', '.join(indexed[:3])}), whose names "
        "are indexes that peft matches to the decoder layers too (LLaMA-Factory 0.9.5 fails the same way); name the "
        f"target modules instead (linear layers here: {', '.join(named)})."
    )


def _example_path(model) -> str:
    names = [name for name, module in model.named_modules() if "Linear" in type(module).__name__]
    return names[0] if names else ""


def _check_targets(model, targets: list[str], key: str) -> None:
    available = {name.split(".")[-1] for name, _ in model.named_modules()}
    qualified = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if t not in available and not any(q.endswith("." + t) or q == t for q in qualified)]
    if missing:
        raise ValueError(
            f"{key}: no module named {', '.join(missing)}; linear layers here: {', '.join(find_all_linear_modules(model))}."
        )


def _new_adapter(model, model_args: "ModelArguments", finetuning_args: "FinetuningArguments"):
    from peft import get_peft_model

    from lathe.llm.model.quantization import is_quantized

    targets = resolve_targets(model, finetuning_args)
    if finetuning_args.additional_target:
        _check_targets(model, finetuning_args.additional_target, "additional_target")
    if (
        finetuning_args.use_dora
        and is_quantized(model)
        and getattr(model, "quantization_method", None) != "bitsandbytes"
    ):
        raise ValueError(
            "use_dora: DoRA works on bitsandbytes-quantized bases only, not on pre-quantized (GPTQ/AWQ/AQLM) ones."
        )
    if model_args.resize_vocab and finetuning_args.additional_target is None:
        # New token rows must train, or the added tokens keep their initial embeddings.
        finetuning_args.additional_target = sorted(
            {
                name.split(".")[-1]
                for name, module in model.named_modules()
                if module is model.get_input_embeddings() or module is model.get_output_embeddings()
            }
        )
        logger.info("resize_vocab: training %s in full with the adapter.", ",".join(finetuning_args.additional_target))
    config = (
        _oft_config(targets, finetuning_args)
        if finetuning_args.finetuning_type == "oft"
        else _lora_config(targets, finetuning_args)
    )
    return get_peft_model(model, config)


def _lora_config(targets, args: "FinetuningArguments"):
    from peft import LoraConfig, TaskType

    init = True
    if args.pissa_init:
        init = "pissa" if args.pissa_iter == -1 else f"pissa_niter_{args.pissa_iter}"
        logger.info(
            "PiSSA initialisation (%s)",
            "exact SVD" if args.pissa_iter == -1 else f"{args.pissa_iter} fast-SVD iterations",
        )
    logger.info(
        "%s on %s (rank %d, alpha %d)", "DoRA" if args.use_dora else "LoRA", targets, args.lora_rank, args.lora_alpha
    )
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        inference_mode=False,
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets,
        use_rslora=args.use_rslora,
        use_dora=args.use_dora,
        modules_to_save=args.additional_target,
        init_lora_weights=init,
    )


def _oft_config(targets, args: "FinetuningArguments"):
    from peft import OFTConfig, TaskType

    logger.info("OFT on %s (oft_rank %d, oft_block_size %d)", targets, args.oft_rank, args.oft_block_size)
    try:
        return OFTConfig(
            task_type=TaskType.CAUSAL_LM,
            inference_mode=False,
            r=args.oft_rank,
            oft_block_size=args.oft_block_size,
            target_modules=targets,
            module_dropout=args.module_dropout,
            modules_to_save=args.additional_target,
        )
    except ValueError as error:  # peft's own check of the block layout, e.g. sizes that do not divide
        raise ValueError(f"oft_rank / oft_block_size: {error}") from error
