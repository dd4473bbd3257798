"""Loading the tokenizer and the model from a local folder or a hub id (or building the model from its config),
in the dtype and attention implementation the config asks for, with the fine-tuning method applied."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from lathe.llm.hub import model_folder
from lathe.llm.model.adapters import count_parameters, init_adapter
from lathe.llm.model.moe import configure_moe
from lathe.llm.model.quantization import configure_quantization, is_quantized, quantization_compute_dtype
from lathe.llm.model.remote_families import configure_remote_family, eager_attention, patch_missing_loss
from lathe.llm.model.tokenizer_check import check_tokenizer_matches_file
from lathe.llm.model.weights_check import check_has_tokenizer, check_loading_info, check_weight_files, mismatch_error
from lathe.llm.remote_code import remote_code_error

if TYPE_CHECKING:
    from lathe.llm.config.train import FinetuningArguments, ModelArguments

__all__ = ["load_tokenizer", "load_config", "load_model", "fix_pad_token", "weights_dtype", "auto_model_class"]

logger = logging.getLogger(__name__)

# flash_attn (LLaMA-Factory's key) -> transformers' attn_implementation; auto keeps the model's default.
ATTENTION_IMPLEMENTATIONS = {
    "auto": None,
    "disabled": "eager",
    "sdpa": "sdpa",
    "fa2": "flash_attention_2",
    "fa3": "flash_attention_3",
}
NORM_NAME_PARTS = ("norm", "ln")


def _model_folder(model_args: "ModelArguments") -> str:
    """A local folder as it is; a hub id is its snapshot in the Hub's cache, downloaded if needed (hub.py)."""
    return model_folder(model_args)


def fix_pad_token(tokenizer) -> None:
    """Padding needs a pad token; like LLaMA-Factory, reuse EOS when the tokenizer has none.

    Labels of padded positions are -100, so reusing EOS never trains the model to predict padding.
    """
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("The tokenizer has no pad token; using its EOS token %r.", tokenizer.eos_token)


def load_tokenizer(model_args: "ModelArguments"):
    """The tokenizer of `model_name_or_path`, padding on the right, with any added tokens. The pad token
    is chosen afterwards by the template (get_template_and_fix_tokenizer: EOS, after the template may
    have replaced EOS), in LLaMA-Factory's order: chatml pads with <|im_end|>, not the original EOS."""
    from transformers import AutoTokenizer

    folder = _model_folder(model_args)
    check_has_tokenizer(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            folder,
            use_fast=model_args.use_fast_tokenizer,
            split_special_tokens=model_args.split_special_tokens,
            padding_side="right",
            trust_remote_code=model_args.trust_remote_code,
            local_files_only=True,
        )
    except (OSError, ValueError) as error:
        named = remote_code_error(error, folder, "tokenizer")
        if named is not None:
            raise named from None
        raise OSError(f"Could not load a tokenizer from {folder} (model_name_or_path): {error}") from error
    check_tokenizer_matches_file(tokenizer, folder)  # before tokens are added: the folder's tokenizer as it is

    if model_args.model_max_length is not None and tokenizer.model_max_length < model_args.model_max_length:
        tokenizer.model_max_length = model_args.model_max_length  # silences "sequence too long" warnings
    for tokens, special in ((model_args.add_tokens, False), (model_args.add_special_tokens, True)):
        if tokens and tokenizer.add_tokens(tokens, special_tokens=special) > 0 and not model_args.resize_vocab:
            model_args.resize_vocab = True
            logger.info("Added tokens %s; the embeddings will be resized (resize_vocab).", ",".join(tokens))
    return tokenizer


def load_config(model_args: "ModelArguments"):
    from transformers import AutoConfig

    folder = _model_folder(model_args)
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=model_args.trust_remote_code, local_files_only=True)
    except ValueError as error:
        named = remote_code_error(error, folder, "model")
        if named is None:
            raise
        raise named from None


def weights_dtype(model_args: "ModelArguments", is_trainable: bool, config=None):
    """The dtype the weights are loaded in.

    Training: the mixed-precision compute dtype (bf16/fp16/pure_bf16) for frozen weights, else
    float32; adapters.init_adapter then keeps trainable weights in float32 unless pure_bf16.
    Inference: infer_dtype; "auto" is the checkpoint's dtype on an accelerator and float32 on CPU,
    where half-precision matmuls are slow or missing.
    """
    import torch

    if is_trainable:
        return getattr(torch, model_args.compute_dtype) if model_args.compute_dtype else torch.float32
    if model_args.infer_dtype != "auto":
        return getattr(torch, model_args.infer_dtype)
    if not torch.cuda.is_available():
        return torch.float32
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(saved, str):
        saved = getattr(torch, saved, None)
    return saved or torch.float32


def load_model(
    tokenizer,
    model_args: "ModelArguments",
    finetuning_args: "FinetuningArguments",
    is_trainable: bool = False,
    meta: bool = False,
):
    """The causal LM of `model_name_or_path` (or a fresh one from its config with train_from_scratch),
    with full/freeze/lora set up for training, or frozen in eval mode for inference.

    meta=True builds the same modules on the meta device without reading any weights: enough to
    count (trainable) parameters for a plan in a second, whatever the model's size. Adapters to
    continue or merge have to be read, so with adapter_name_or_path the weights are loaded anyway.
    """
    if meta and model_args.adapter_name_or_path:
        meta = False
    model = _instantiate(model_args, is_trainable, meta)
    if not os.path.isdir(model_args.model_name_or_path):
        # A hub id keeps its name, as when transformers downloads it: peft writes it as the adapter's base model.
        model.name_or_path = model.config._name_or_path = model_args.model_name_or_path
    _fit_embeddings_to(model, tokenizer, model_args)
    if is_trainable:
        patch_missing_loss(model)
        _prepare_for_training(model, model_args)
    if hasattr(model, "add_model_tags"):  # as LLaMA-Factory tags every model: PEFT's model card lists the tag
        model.add_model_tags(["llama-factory"])
    model = init_adapter(model, model_args, finetuning_args, is_trainable)
    if is_trainable:
        model.train()
    else:
        model.requires_grad_(False)
        model.eval()
    _report_parameters(model, model_args, is_trainable)
    return model


def _instantiate(model_args: "ModelArguments", is_trainable: bool, meta: bool):
    """The transformers model: from its weights, fresh from its config (train_from_scratch), or on the meta device."""
    import torch

    folder = _model_folder(model_args)
    config = load_config(model_args)
    model_class = auto_model_class(config)
    dtype = weights_dtype(model_args, is_trainable, config)
    attention = attention_implementation(model_args.flash_attn, getattr(config, "model_type", None))
    # a cache only costs memory in training; a multimodal model's text_config too (saved so, as LLaMA-Factory saves it)
    for part in (config, getattr(config, "text_config", None)):
        if part is not None:
            part.use_cache = model_args.use_kv_cache and not is_trainable
    configure_moe(config, model_args.moe_aux_loss_coef, is_trainable)  # read when the model is built
    configure_remote_family(config, is_trainable)
    kwargs = {"dtype": dtype, "trust_remote_code": model_args.trust_remote_code}
    if attention is not None:
        kwargs["attn_implementation"] = attention
    quantized = {}  # from_pretrained arguments that load the base quantized (quantization_bit, GPTQ/AWQ/AQLM)
    if not model_args.train_from_scratch:
        quantized = configure_quantization(config, model_args, quantization_compute_dtype(model_args, config))
    try:
        if meta:
            # The unquantized modules: parameter counts equal the quantized model's (see parameter_count).
            with torch.device("meta"):
                return thinker_of(model_class.from_config(_without_quantization(config), **kwargs))
        if model_args.train_from_scratch:
            return thinker_of(model_class.from_config(config, **kwargs))
        low_cpu_mem_usage = model_args.low_cpu_mem_usage or "device_map" in quantized  # a device map needs it
        check_weight_files(folder)
        model, info = model_class.from_pretrained(
            folder,
            config=config,
            low_cpu_mem_usage=low_cpu_mem_usage,
            local_files_only=True,
            output_loading_info=True,
            **quantized,
            **kwargs,
        )
        check_loading_info(info, folder)
        return thinker_of(model)
    except RuntimeError as error:
        named = mismatch_error(error, folder)
        if named is None:
            raise
        raise named from error
    except ImportError as error:
        if attention is not None and "flash" in attention:
            raise ImportError(
                f"flash_attn: {model_args.flash_attn} needs the flash-attn package and a supported GPU ({error}). "
                "Use flash_attn: sdpa or auto."
            ) from error
        raise


def auto_model_class(config):
    """The transformers auto class that builds `config`'s generating model: AutoModelForImageTextToText for a
    vision-language config (LLaMA-Factory's loader checks that mapping first), AutoModelForSeq2SeqLM for an
    audio-text one (Qwen2-Audio: LLaMA-Factory's next check; lathe takes it for configs with an audio tower only),
    AutoModelForTextToWaveform for the Qwen Omni models (LLaMA-Factory's third check), else AutoModelForCausalLM."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSeq2SeqLM,
        AutoModelForTextToWaveform,
    )

    if type(config) in AutoModelForImageTextToText._model_mapping:
        return AutoModelForImageTextToText
    if getattr(config, "audio_config", None) is not None and type(config) in AutoModelForSeq2SeqLM._model_mapping:
        return AutoModelForSeq2SeqLM
    if getattr(config, "model_type", None) in OMNI_MODEL_TYPES:
        return AutoModelForTextToWaveform
    return AutoModelForCausalLM


OMNI_MODEL_TYPES = ("qwen2_5_omni", "qwen3_omni_moe")  # a thinker (text, image, audio in) and a talker (speech out)


def thinker_of(model):
    """The part that trains: a Qwen Omni model's thinker (LLaMA-Factory trains and saves it alone), else the model."""
    if getattr(getattr(model, "config", None), "model_type", None) in OMNI_MODEL_TYPES:
        return model.thinker
    return model


def attention_implementation(flash_attn: str, model_type: str | None) -> str | None:
    """transformers' attn_implementation for LLaMA-Factory's flash_attn, with LLaMA-Factory's fallbacks: fa2
    without FlashAttention-2 keeps the model's default attention (Gemma 2: eager, for its soft-capping), and
    says so; None keeps the model's default. Youtu-VL's remote code runs eager only (remote_families)."""
    from transformers.utils import is_flash_attn_2_available

    if eager_attention(flash_attn, model_type):
        return "eager"
    if flash_attn == "fa2" or (flash_attn == "auto" and model_type == "gemma2"):
        if is_flash_attn_2_available():
            return "flash_attention_2"
        if model_type == "gemma2":
            logger.warning("flash_attn: FlashAttention-2 is not installed: Gemma 2 uses eager attention.")
            return "eager"
        if flash_attn == "fa2":
            logger.warning(
                "flash_attn: fa2 asks for FlashAttention-2, which is not installed (it needs the flash-attn package "
                "and a supported GPU): the model's default attention is used instead, as LLaMA-Factory does."
            )
            return None
    return ATTENTION_IMPLEMENTATIONS[flash_attn]


def _fit_embeddings_to(model, tokenizer, model_args: "ModelArguments") -> None:
    """Resize the embeddings when asked (resize_vocab), or when the template (or add_tokens) gave the
    tokenizer ids the embeddings have no rows for."""
    if len(tokenizer) > model.get_input_embeddings().weight.size(0) and not model_args.resize_vocab:
        if is_quantized(model):
            raise ValueError(
                f"The tokenizer has {len(tokenizer)} tokens but the quantized model only "
                f"{model.get_input_embeddings().weight.size(0)} embedding rows, and quantized embeddings "
                "cannot be resized: train without quantization_bit, or with a template that adds no tokens."
            )
        logger.warning(
            "The tokenizer has %d tokens but the model only %d embedding rows: resizing (resize_vocab).",
            len(tokenizer),
            model.get_input_embeddings().weight.size(0),
        )
        model_args.resize_vocab = True
    if model_args.resize_vocab:
        _resize_embeddings(model, tokenizer)


def _report_parameters(model, model_args: "ModelArguments", is_trainable: bool) -> None:
    trainable, total = count_parameters(model)
    if is_trainable:
        logger.info(
            "trainable params: %s || all params: %s || trainable%%: %.4f",
            f"{trainable:,}",
            f"{total:,}",
            100 * trainable / total,
        )
    else:
        logger.info("all params: %s", f"{total:,}")
    if model_args.print_param_status:
        for name, param in model.named_parameters():
            print(f"name: {name}, dtype: {param.dtype}, device: {param.device}, trainable: {param.requires_grad}")


def _without_quantization(config):
    """A copy of a pre-quantized checkpoint's config that from_config builds as plain modules."""
    if not getattr(config, "quantization_config", None):
        return config
    import copy

    config = copy.deepcopy(config)
    del config.quantization_config
    return config


def _resize_embeddings(model, tokenizer) -> None:
    """Grow the embeddings (and an untied head) to the tokenizer; rounded up to 64 rows like LLaMA-Factory."""
    import torch

    current = model.get_input_embeddings().weight.size(0)
    if len(tokenizer) <= current:
        return
    if not isinstance(model.get_output_embeddings(), torch.nn.Linear):
        raise ValueError(f"resize_vocab: {type(model).__name__} has no linear output head to resize.")
    # transformers initialises the new rows from the mean and covariance of the old ones (which a
    # meta-device model for a plan does not have).
    is_meta = model.get_input_embeddings().weight.is_meta
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64, mean_resizing=not is_meta)
    logger.info("Resized the embeddings from %d to %d rows.", current, model.get_input_embeddings().weight.size(0))


def _prepare_for_training(model, model_args: "ModelArguments") -> None:
    import torch

    if model_args.upcast_layernorm:
        for name, param in model.named_parameters():
            if param.ndim == 1 and any(part in name for part in NORM_NAME_PARTS):
                param.data = param.data.to(torch.float32)
    if model_args.upcast_lmhead_output:
        head = model.get_output_embeddings()
        if isinstance(head, torch.nn.Linear) and head.weight.dtype != torch.float32:
            # Softmax over a large vocabulary in half precision loses the small probabilities.
            head.register_forward_hook(lambda module, inputs, output: output.to(torch.float32))
