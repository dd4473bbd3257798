"""Quantized bases: on-the-fly quantization (bitsandbytes 4/8-bit, HQQ, EETQ) and pre-quantized
checkpoints (GPTQ, AWQ, AQLM), loaded through transformers with LLaMA-Factory's settings; the one
module that imports bitsandbytes.

What runs where (bitsandbytes 0.50 on torch 2.13, measured here): 4-bit nf4 and fp4, with or without
double quantization, and 8-bit LLM.int8 all train on the CPU (forward and backward through the frozen
quantized weights). HQQ and EETQ run on a GPU only: transformers refuses HQQ with a CPU device map, and
EETQ's kernels are CUDA code. Pre-quantized checkpoints need their packages (transformers' loaders
name them); a missing one is an error that names it before any weight is read.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = [
    "PREQUANTIZED_PACKAGES",
    "configure_quantization",
    "dequantize",
    "is_quantized",
    "quantization_compute_dtype",
    "parameter_count",
    "training_device",
]

logger = logging.getLogger(__name__)

# quant_method of a pre-quantized checkpoint -> (import names transformers 5 needs, pip install line).
PREQUANTIZED_PACKAGES = {
    "gptq": (("gptqmodel", "optimum"), "pip install gptqmodel optimum"),
    "awq": (("gptqmodel",), "pip install gptqmodel"),
    "aqlm": (("aqlm",), "pip install aqlm"),
}
_ON_THE_FLY_PACKAGES = {
    "bnb": ("bitsandbytes", "pip install 'lathe[qlora]'  (bitsandbytes)"),
    "hqq": ("hqq", "pip install hqq"),
    "eetq": ("eetq", "pip install eetq  (needs CUDA; not on PyPI for every platform)"),
}


def _missing(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is None


def training_device():
    """Where a quantized model is placed: quantized weights are created on their device while loading,
    so transformers needs a device map (this process's GPU, else the CPU)."""
    import os

    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def quantization_compute_dtype(model_args, config):
    """The dtype quantized layers compute in: the mixed-precision dtype (bf16/fp16/pure_bf16), else as
    LLaMA-Factory infers it: bfloat16 on a GPU that has it (for a bfloat16 or unspecified checkpoint),
    float16 on other GPUs, float32 on the CPU."""
    import torch

    if model_args.compute_dtype:
        return getattr(torch, model_args.compute_dtype)
    if not torch.cuda.is_available():
        return torch.float32
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    saved = getattr(torch, saved, None) if isinstance(saved, str) else saved
    if torch.cuda.is_bf16_supported() and saved in (torch.bfloat16, None):
        return torch.bfloat16
    return torch.float16


def configure_quantization(config, model_args, compute_dtype) -> dict[str, Any]:
    """The from_pretrained keyword arguments that load the base quantized ({} when it is not).

    A checkpoint saved quantized (config.quantization_config) wins over quantization_bit, as in LLaMA-Factory.
    """
    saved = getattr(config, "quantization_config", None)
    if saved:
        _prepare_prequantized(saved, model_args)
        return {}
    if model_args.quantization_bit is None:
        return {}
    method = model_args.quantization_method
    package, hint = _ON_THE_FLY_PACKAGES[method]
    device = training_device()
    if method in ("hqq", "eetq") and device.type != "cuda":
        raise ValueError(
            f"quantization_method: {method} runs on a GPU only (transformers refuses it on the CPU); "
            "use quantization_method: bnb, which trains 4- and 8-bit bases on the CPU too."
        )
    if _missing(package):
        raise ImportError(f"quantization_method: {method} needs the {package} package: {hint}")
    kwargs = {"quantization_config": _quantization_config(method, model_args, compute_dtype)}
    if model_args.quantization_device_map == "auto":
        if method == "bnb" and model_args.quantization_bit != 4:
            raise ValueError("quantization_device_map: auto needs quantization_bit: 4 with bitsandbytes.")
        kwargs["device_map"] = "auto"
    else:
        kwargs["device_map"] = {"": device}
    logger.info("Quantizing the model to %d bit with %s.", model_args.quantization_bit, method)
    return kwargs


def _quantization_config(method: str, model_args, compute_dtype):
    """LLaMA-Factory's settings for each library (the 4-bit storage dtype = the compute dtype, which
    lets FSDP shard the quantized weights like any other tensor of that dtype)."""
    import transformers

    bits = model_args.quantization_bit
    if method == "bnb" and bits == 8:
        return transformers.BitsAndBytesConfig(load_in_8bit=True)
    if method == "bnb":
        return transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_compute_dtype=compute_dtype,
            bnb_4bit_use_double_quant=model_args.double_quantization,
            bnb_4bit_quant_type=model_args.quantization_type,
            bnb_4bit_quant_storage=compute_dtype,
        )
    if method == "hqq":  # axis 0: the ATen kernel
        return transformers.HqqConfig(nbits=bits, quant_zero=False, quant_scale=False, axis=0)
    return transformers.EetqConfig()


def _prepare_prequantized(saved, model_args) -> None:
    """Check that the checkpoint's quantization library is installed; LLaMA-Factory's fixes to its settings."""
    saved = saved if isinstance(saved, dict) else saved.to_dict()
    method = str(saved.get("quant_method", "")).lower()
    if model_args.quantization_bit is not None:
        logger.warning(
            "quantization_bit does not apply: %s is already quantized (%s).", model_args.model_name_or_path, method
        )
    if method in PREQUANTIZED_PACKAGES:
        packages, hint = PREQUANTIZED_PACKAGES[method]
        missing = [package for package in packages if _missing(package)]
        if missing:
            raise ImportError(
                f"{model_args.model_name_or_path} holds a checkpoint quantized with {method.upper()}; loading it "
                f"needs {' and '.join(missing)}: {hint}"
            )
    if method == "gptq":
        saved.pop("disable_exllama", None)
        saved["use_exllama"] = False  # exllama kernels cannot train
    if method == "aqlm":
        saved["bits"] = 2
    logger.info("Loading a %s-bit %s-quantized model.", saved.get("bits", "?"), method.upper())


def is_quantized(model) -> bool:
    return getattr(model, "quantization_method", None) is not None or getattr(model, "hf_quantizer", None) is not None


def parameter_count(param) -> int:
    """Elements a parameter stands for: a packed 4-bit bitsandbytes tensor holds 2 per byte of its storage
    dtype, so counts match the unquantized model (LLaMA-Factory counts them the same way)."""
    if type(param).__name__ == "Params4bit":
        storage = getattr(param, "quant_storage", None)
        return param.numel() * 2 * getattr(storage, "itemsize", 1)
    return param.numel()


def dequantize(model, dtype):
    """The model with every bitsandbytes layer replaced by a plain nn.Linear holding its dequantized weight, in
    `dtype`: what the quantized base computed, in a form adapters can be merged into and saved. Each layer is
    checked against its own forward on random inputs (a wrong dequantization is an error, not a silent change)."""
    import bitsandbytes
    import torch

    replaced = 0
    for name, module in list(model.named_modules()):
        kind = type(module).__name__
        if kind not in ("Linear4bit", "Linear8bitLt"):
            continue
        weight = _dequantized_weight(bitsandbytes, module, kind).to(torch.float32)
        plain = torch.nn.Linear(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            device=weight.device,
            dtype=torch.float32,
        )
        with torch.no_grad():
            plain.weight.copy_(weight)
            if module.bias is not None:
                plain.bias.copy_(module.bias.float())
        _check_layer(name, module, plain)
        model.set_submodule(name, plain.to(dtype))
        replaced += 1
    if replaced == 0:
        raise ValueError(
            "dequantize: found no bitsandbytes layers (a GPTQ/AWQ/AQLM checkpoint cannot be dequantized here)."
        )
    for attribute in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attribute):
            delattr(model.config, attribute)
    for attribute in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attribute):
            delattr(model, attribute)
    model.is_loaded_in_4bit = model.is_loaded_in_8bit = False
    return model.to(dtype)


def _dequantized_weight(bitsandbytes, module, kind):
    if kind == "Linear4bit":
        return bitsandbytes.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
    scale = module.state.SCB if module.state.SCB is not None else module.weight.SCB
    return bitsandbytes.functional.int8_vectorwise_dequant(module.weight.data, scale)


def _check_layer(name: str, quantized, plain) -> None:
    """The plain layer must compute what the quantized one does, up to the quantized kernel's rounding (it may
    compute in bfloat16/float16 on the CPU: about 1% of the output's scale)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(4, plain.in_features, generator=generator).to(plain.weight.device)
    with torch.no_grad():
        expected = quantized(probe.to(getattr(quantized, "compute_dtype", None) or probe.dtype)).float()
        actual = plain(probe)
    error = float((actual - expected).abs().max()) / max(float(expected.abs().max()), 1e-6)
    if error > 2e-2:
        raise RuntimeError(
            f"dequantize: {name} dequantized computes differently from the quantized layer "
            f"(relative difference {error:.2e}); nothing was exported."
        )
