"""The model, tokenizer and template that `lathe chat`, `lathe api` and `lathe export` serve: the same
loading code and the same template as training, so what is served renders conversations and stops
exactly as it was trained to."""

from __future__ import annotations

import copy

__all__ = ["load_for_inference", "load_tokenizer_and_template"]


def load_tokenizer_and_template(config):
    """The tokenizer with the template's EOS, pad token, stop words and chat_template, and the template."""
    from lathe.llm.model.loader import load_tokenizer
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tokenizer = load_tokenizer(config.model)
    template = get_template_and_fix_tokenizer(tokenizer, config.data)
    return tokenizer, template


def load_for_inference(config, dtype: str | None = None, with_adapters: bool = True):
    """(model, tokenizer, template): the base model with every adapter of adapter_name_or_path merged
    in (or a full/freeze output folder as it is), in eval mode, its generation config stopping on the
    template's stop tokens. `dtype` overrides infer_dtype (export merges in float32)."""
    from lathe.llm.model.loader import load_model
    from lathe.llm.workflows.outputs import set_stop_tokens

    tokenizer, template = load_tokenizer_and_template(config)
    model_args = copy.copy(config.model)
    if dtype is not None:
        model_args.infer_dtype = dtype
    if not with_adapters:
        model_args.adapter_name_or_path = None
    model = load_model(tokenizer, model_args, config.finetuning, is_trainable=False)
    set_stop_tokens(model, tokenizer, template)
    return model, tokenizer, template
