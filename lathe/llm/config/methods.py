"""What the fine-tuning method keys may hold: target-module lists or patterns, and LLaMA-Factory's
cross-key checks of the methods (the LoRA family, OFT, LLaMA Pro, quantized training), run once
when the config is parsed. No torch import: parsing a config stays fast."""

from __future__ import annotations

import re
from typing import Any

from lathe.llm.config.values import split_commas

__all__ = ["QUANTIZATION_BITS", "check_methods", "check_quantization_bit", "check_quantized_training", "target_modules"]

# quantization_method -> the bit widths it quantizes to (LLaMA-Factory's, which are the libraries').
QUANTIZATION_BITS = {"bnb": (4, 8), "hqq": (1, 2, 3, 4, 5, 6, 8), "eetq": (8,)}
_REGEX_SYNTAX = re.compile(r"[\\^$*+?()\[\]{}|]")


def target_modules(value: Any, key: str) -> list[str] | str | None:
    """A comma-separated list of module names, or one regular expression kept whole (it may hold commas).

    Names are what LLaMA-Factory accepts; a value with regular-expression syntax fails there ("target
    modules not found"), so reading it as peft's full-match pattern changes nothing for its configs.
    """
    if isinstance(value, str) and _REGEX_SYNTAX.search(value):
        try:
            re.compile(value)
        except re.error as error:
            raise ValueError(f"{key}: {value!r} is not a valid regular expression ({error}).") from None
        return value
    return split_commas(value)


def check_methods(args) -> None:
    """LLaMA-Factory's checks of the FinetuningArguments method keys, with the fix in the message."""
    method = args.finetuning_type
    if args.use_llama_pro and method not in ("freeze", "lora"):
        raise ValueError(
            f"use_llama_pro trains the expanded blocks with finetuning_type freeze or lora, not {method!r}."
        )
    if method != "lora":
        for key in ("loraplus_lr_ratio", "use_rslora", "use_dora", "pissa_init"):
            if getattr(args, key) not in (None, False):
                raise ValueError(f"{key} only applies to finetuning_type: lora (got {method!r}).")
    if args.loraplus_lr_ratio is not None and args.loraplus_lr_ratio <= 0:
        raise ValueError(f"loraplus_lr_ratio must be positive (B's learning rate / A's), got {args.loraplus_lr_ratio}")
    if args.pissa_iter < -1:
        raise ValueError(
            f"pissa_iter must be a number of fast-SVD iterations, or -1 for the exact SVD; got {args.pissa_iter}"
        )
    if method == "oft":
        if args.oft_rank < 0 or args.oft_block_size < 0 or (args.oft_rank == 0) == (args.oft_block_size == 0):
            raise ValueError(
                f"oft: set exactly one of oft_rank and oft_block_size to a positive number "
                f"(got oft_rank {args.oft_rank}, oft_block_size {args.oft_block_size})."
            )
        if not 0.0 <= args.module_dropout < 1.0:
            raise ValueError(f"module_dropout must be a probability in [0, 1), got {args.module_dropout}")


def check_quantization_bit(method: str, bits: int | None) -> None:
    if bits is not None and bits not in QUANTIZATION_BITS[method]:
        widths = "/".join(str(width) for width in QUANTIZATION_BITS[method])
        raise ValueError(f"quantization_bit: {method} quantizes to {widths} bits, got {bits}.")


def check_quantized_training(model, finetuning, training, where: str = "") -> None:
    """What a quantized base allows (LLaMA-Factory's rules): adapters on top, nothing that writes its weights.
    `training` is None for inference and export configs."""
    if model.quantization_device_map == "auto" and training is not None and training.do_train:
        raise ValueError(
            f"quantization_device_map: auto{where} is for inference; training keeps the model on one device."
        )
    if model.quantization_bit is None:
        return
    if finetuning.finetuning_type not in ("lora", "oft"):
        raise ValueError(
            f"quantization_bit{where}: a quantized base takes adapters only: set finetuning_type lora or oft "
            f"(got {finetuning.finetuning_type!r})."
        )
    if model.train_from_scratch:
        raise ValueError(
            f"train_from_scratch{where} builds random weights; quantization_bit quantizes loaded ones: set one of them."
        )
    if finetuning.pissa_init:
        raise ValueError(
            f"pissa_init{where} needs the full-precision weights: initialise PiSSA without quantization_bit "
            "(or with LLaMA-Factory's scripts/pissa_init.py), then train that adapter via adapter_name_or_path."
        )
    if model.resize_vocab:
        raise ValueError(f"resize_vocab{where}: the embeddings of a quantized model cannot be resized.")
    adapters = model.adapter_name_or_path or []
    if adapters and finetuning.create_new_adapter:
        raise ValueError(
            f"create_new_adapter{where} would merge into quantized weights: merge the adapter first (lathe export)."
        )
    if len(adapters) > 1:
        raise ValueError(
            f"adapter_name_or_path{where}: a quantized model takes a single adapter; merge the others first (lathe export)."
        )


def describe_method(model, finetuning) -> str:
    """One phrase for the printed plan, e.g. "lora (DoRA, LoRA+ x16) on a 4-bit nf4 bitsandbytes base"."""
    variants = [
        name
        for name, used in (
            ("rsLoRA", finetuning.use_rslora),
            ("DoRA", finetuning.use_dora),
            ("PiSSA", finetuning.pissa_init),
            (
                f"LoRA+ x{finetuning.loraplus_lr_ratio:g}" if finetuning.loraplus_lr_ratio else "",
                finetuning.loraplus_lr_ratio,
            ),
            ("LLaMA Pro", finetuning.use_llama_pro),
        )
        if used
    ]
    text = finetuning.finetuning_type + (f" ({', '.join(variants)})" if variants else "")
    if model.quantization_bit is not None:
        kind = (
            f" {model.quantization_type}" if model.quantization_method == "bnb" and model.quantization_bit == 4 else ""
        )
        library = {"bnb": "bitsandbytes", "hqq": "HQQ", "eetq": "EETQ"}[model.quantization_method]
        article = "an" if model.quantization_bit == 8 else "a"
        text += f" on {article} {model.quantization_bit}-bit{kind} {library} base"
    return text
