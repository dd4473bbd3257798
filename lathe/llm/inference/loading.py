"""The model, tokenizer and template that `lathe chat`, `lathe api` and `lathe export` serve: the same
loading code and the same template as training, so what is served renders conversations and stops
exactly as it was trained to."""

from __future__ import annotations

import copy
import logging

__all__ = ["load_for_inference", "load_tokenizer_and_template", "exported_template_name"]

logger = logging.getLogger(__name__)


def load_tokenizer_and_template(config):
    """The tokenizer with the template's EOS, pad token, stop words and chat_template, and the template.
    With no `template` given, a folder `lathe export` wrote is served with the template it was exported with
    (its chat_template is that template's, word for word)."""
    from lathe.llm.model.loader import load_tokenizer
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.templates.parsing import UnreadableChatTemplate

    tokenizer = load_tokenizer(config.model)
    data_args = config.data
    if data_args.template is None:
        name = exported_template_name(tokenizer, _image_model_type(config.model))
        if name is not None:
            logger.info(
                "%s holds lathe's chat_template of template %r: serving with it.", config.model.model_name_or_path, name
            )
            data_args = copy.copy(data_args)
            data_args.template = name
    try:
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
    except UnreadableChatTemplate as error:
        from lathe.llm.templates.check import matching_templates

        matches = matching_templates(tokenizer)
        hint = f"it renders like {', '.join(matches)}" if matches else "no template lathe knows renders like it"
        raise ValueError(
            f"`template` is not set and lathe cannot read the chat_template of {config.model.model_name_or_path} "
            f"to chat with it ({error.reason}). Set `template` in the config ({hint})."
        ) from None
    return tokenizer, template


def exported_template_name(tokenizer, image_model_type: str | None = None) -> str | None:
    """The registered template whose chat_template (as lathe export writes it) is the tokenizer's exactly. Several
    render alike (qwen2_vl, qwen2_omni, llava_next_qwen); for a model folder with an image processor
    (`image_model_type`: its config's model_type) the one of the model's family wins, then one whose images lathe
    encodes, so an exported vision-language model is served with images."""
    from lathe.llm.multimodal.plugins import IMPLEMENTED
    from lathe.llm.templates.registry import TEMPLATES

    own = getattr(tokenizer, "chat_template", None)
    if not isinstance(own, str):
        return None
    matches = []
    for name, template in sorted(TEMPLATES.items()):
        try:
            if template.jinja_chat_template(tokenizer) == own:
                matches.append((name, template.multimodal))
        except Exception:  # noqa: BLE001 (a template that cannot be written for this tokenizer is not the one)
            continue
    if image_model_type is not None:
        matches.sort(key=lambda match: (image_model_type not in match, match[1] not in IMPLEMENTED))
    return matches[0][0] if matches else None


def _image_model_type(model_args) -> str | None:
    """The model_type of a model folder that holds an image processor (preprocessor_config.json, or
    processor_config.json, where transformers 5 writes a whole processor's image settings), else None."""
    import json
    import os

    from lathe.llm.hub import model_folder

    folder = model_folder(model_args)
    if not any(
        os.path.isfile(os.path.join(folder, name)) for name in ("preprocessor_config.json", "processor_config.json")
    ):
        return None
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
            return str(json.load(handle).get("model_type"))
    except (OSError, ValueError):
        return ""


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
