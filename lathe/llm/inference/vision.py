"""Images, videos and audio for a served model (lathe chat, lathe api, lathe export): the model folder's
processor, and a conversation with its media encoded exactly as training encodes it (the family's pixel budget,
`<image>` / `<video>` / `<audio>` expanded to the family's tokens, the processor's tensors), or the one-line reason
this model takes no such input. Qwen2-VL / Qwen3-VL images use their module's functions; videos and audio, and
the other families' images, the training FamilyPlugin (the same regularize, process_messages, prefix and
batch_inputs the data pipeline and collator call: frames sampled as LLaMA-Factory samples them)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from lathe.llm.multimodal.images import (
    AUDIO_PLACEHOLDER,
    DEFAULT_IMAGE_MAX_PIXELS,
    DEFAULT_IMAGE_MIN_PIXELS,
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    check_placeholders,
)

logger = logging.getLogger(__name__)

# The family functions a served conversation needs (lathe/llm/multimodal/qwen2_vl.py has them).
SERVING_FUNCTIONS = ("image_inputs", "expand_placeholders")
# A processor's own files besides preprocessor_config.json (transformers 5 writes them with the processor).
PROCESSOR_FILES = ("processor_config.json", "video_preprocessor_config.json")


# Tensors generation computes itself for the whole batch (3-D rotary positions): never passed from one row.
POSITION_KEYS = ("position_ids", "rope_deltas")


@dataclass
class ImageEncoder:
    """Encodes a conversation's media as training does. `refusal` is set when the model takes no images (a
    text-only model, a family lathe cannot encode yet, no image processor in the folder, an audio family); videos
    and audio go through `plugin` (or, for the Qwen families whose images use their module's functions,
    `media_plugin`), and `media_refusal` says why there is none."""

    family: object = None
    image_processor: object = None
    max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS
    min_pixels: int = DEFAULT_IMAGE_MIN_PIXELS
    refusal: str | None = None
    names: dict = field(default_factory=dict)  # what the refusal names: the model and template
    plugin: object = None  # the training FamilyPlugin (families beside Qwen2-VL): it encodes, `family` is unused
    media_plugin: object = None  # the Qwen families' FamilyPlugin, for their videos
    media_refusal: str | None = None  # why neither plugin is there (videos and audio are then refused)

    def refusal_of(self, kind: str) -> str | None:
        """Why `kind` ("image", "video", "audio") input is refused, or None."""
        if kind == "image":
            return self.refusal
        plugin = self.plugin or self.media_plugin
        if plugin is None:
            return self.media_refusal or self.refusal or f"This model takes no {kind} input."
        if kind not in plugin.kinds:
            return f"the {plugin.name} family takes no {kind} input."
        return None  # (a video processor missing torchvision is named when the video is encoded)

    def encode(self, turns: list[dict], images: list, videos=(), audios=()) -> tuple[list[dict], dict]:
        """(turns with each `<image>` expanded, the processor's tensors). Images go where their `<image>`
        placeholders are; with no placeholder at all they go before the text of the first turn, as LLaMA-Factory's
        chat engine puts them (videos and audio likewise: `<audio>`, `<video>`, `<image>` in that order). A
        ValueError says what does not fit (the refusal, the placeholder count)."""
        if videos or audios:
            return self._encode_media(turns, {"image": list(images), "video": list(videos), "audio": list(audios)})
        if not images:
            return turns, {}
        if self.refusal is not None:
            raise ValueError(self.refusal)
        turns = [dict(turn) for turn in turns]
        if not any(IMAGE_PLACEHOLDER in turn["content"] for turn in turns):
            turns[0]["content"] = IMAGE_PLACEHOLDER * len(images) + turns[0]["content"]
        check_placeholders(turns, {"image": len(images)}, "the conversation")
        if self.plugin is not None:
            from lathe.llm.multimodal.encode import EXPANDED

            media = {"image": self.plugin.regularize("image", images, "the conversation")}
            # marked as the data pipeline marks them: LLaVA's expanded token is `<image>` itself
            expanded = [{**turn, EXPANDED: True} for turn in self.plugin.process_messages(turns, media)]
            return expanded, media
        media = self.family.image_inputs(images, self.image_processor, self.max_pixels, self.min_pixels)
        expanded = self.family.expand_placeholders(turns, media["image_grid_thw"], self.image_processor.merge_size)
        return expanded, media

    def _encode_media(self, turns: list[dict], items: dict[str, list]) -> tuple[list[dict], dict]:
        """A conversation with videos or audio (and maybe images), through the family's training plugin."""
        from lathe.llm.multimodal.encode import EXPANDED

        for kind, values in items.items():
            refusal = self.refusal_of(kind) if values else None
            if refusal is not None:
                raise ValueError(refusal)
        plugin = self.plugin or self.media_plugin
        turns = [dict(turn) for turn in turns]
        for kind, placeholder in (
            ("image", IMAGE_PLACEHOLDER),
            ("video", VIDEO_PLACEHOLDER),
            ("audio", AUDIO_PLACEHOLDER),
        ):
            if items[kind] and not any(placeholder in turn["content"] for turn in turns):
                turns[0]["content"] = placeholder * len(items[kind]) + turns[0]["content"]
        check_placeholders(turns, {kind: len(values) for kind, values in items.items()}, "the conversation")
        media = {kind: plugin.regularize(kind, values, "the conversation") for kind, values in items.items() if values}
        return [{**turn, EXPANDED: True} for turn in plugin.process_messages(turns, media)], media

    def finish(self, prompt_ids: list[int], media: dict, model=None) -> tuple[list[int], dict]:
        """(the prompt ids, the model's media tensors) of a prompt the template encoded from encode's turns: a
        plugin family's image prefix (PaliGemma) added and its collator tensors for the one row (pixel_values,
        image_sizes, token_type_ids, cross_attention_mask, pixel_values_videos, input_features, ...), as training
        collates a batch of it alone; the 3-D positions are left to generation, which computes them per batch."""
        plugin = self.plugin
        if plugin is None and any(kind in media for kind in ("image", "video", "audio")):
            plugin = self.media_plugin  # a Qwen family's videos (its images alone come as tensors already)
        if plugin is None or not media:
            return prompt_ids, media
        import torch

        prompt_ids, _ = plugin.process_token_ids(list(prompt_ids), None, media)
        batch = {"input_ids": torch.tensor([prompt_ids]), "attention_mask": torch.ones(1, len(prompt_ids))}
        inputs = plugin.batch_inputs([media], batch, model, [prompt_ids])
        return prompt_ids, {
            key: torch.as_tensor(value)
            for key, value in inputs.items()
            if key not in POSITION_KEYS and value is not None
        }


def load_image_encoder(config, model, template, tokenizer=None) -> ImageEncoder:
    """The encoder for `model` served with `template`: the template's multimodal family, the image processor of
    model_name_or_path, and image_max_pixels / image_min_pixels as training read them."""
    from lathe.llm.multimodal.plugins import plugin_module

    name = config.model.model_name_or_path
    if all(getattr(model.config, tower, None) is None for tower in ("vision_config", "audio_config")):
        return ImageEncoder(refusal=f"{name} is a text-only model ({type(model).__name__}): it takes no images.")
    if not template.multimodal:
        return ImageEncoder(
            refusal=f"template {template.name!r} is a text template: serve {name} with its multimodal template "
            "(e.g. qwen2_vl) to send images."
        )
    try:
        family = plugin_module(template.multimodal, template.name)
    except ValueError as error:
        return ImageEncoder(refusal=str(error))
    if not all(hasattr(family, function) for function in SERVING_FUNCTIONS):
        return _plugin_encoder(config, template, tokenizer)
    try:
        image_processor = load_image_processor(config.model)
    except OSError as error:
        return ImageEncoder(refusal=f"{name} has no image processor, so it takes no images here: {error}")
    try:
        media_plugin, media_refusal = _media_plugin(config, template, tokenizer)
    except Exception as error:  # noqa: BLE001 (videos are refused in one line; the images above still serve)
        media_plugin, media_refusal = None, f"{name}: it takes no videos here: {type(error).__name__}: {error}"
    return ImageEncoder(
        family,
        image_processor,
        _config_value(config, "image_max_pixels", DEFAULT_IMAGE_MAX_PIXELS),
        _config_value(config, "image_min_pixels", DEFAULT_IMAGE_MIN_PIXELS),
        media_plugin=media_plugin,
        media_refusal=media_refusal,
    )


def _plugin_encoder(config, template, tokenizer) -> ImageEncoder:
    """The encoder of a family served through its training FamilyPlugin, with the model folder's processor and
    the run's media keys; the family's own refusal (no image input, a missing package) otherwise."""
    from lathe.llm.multimodal.base import FamilyPlugin

    plugin, refusal = _media_plugin(config, template, tokenizer)
    if plugin is None:
        return ImageEncoder(refusal=refusal, media_refusal=refusal)
    if type(plugin).finish_batch is not FamilyPlugin.finish_batch:  # the decoder passes batch_inputs as they are
        refusal = (
            f"template {template.name!r}: the {plugin.name} family's model takes its batch in its own form "
            "(MiniCPM-V's `data` dict) and generates with its own code; lathe's decoder sends it no images."
        )
        return ImageEncoder(refusal=refusal, media_refusal=refusal)
    image_processor = getattr(plugin.processor, "image_processor", None)
    if "image" not in plugin.kinds:  # an audio family: its audio is served, images are refused
        refusal = f"template {template.name!r}: the {plugin.name} family takes no images."
        return ImageEncoder(refusal=refusal, plugin=plugin)
    return ImageEncoder(refusal=None, plugin=plugin, image_processor=image_processor)


def _media_plugin(config, template, tokenizer):
    """(the family's training FamilyPlugin with the model folder's processor and the run's media keys, None) or
    (None, the one-line reason there is none: a missing package, no processor, ...)."""
    from lathe.llm.hub import model_folder
    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.encode import load_processor
    from lathe.llm.multimodal.plugins import get_plugin

    if tokenizer is None:
        return None, f"template {template.name!r}: media input needs the served tokenizer."
    defaults = MediaSettings()
    settings = MediaSettings(
        **{key: _config_value(config, key, value) for key, value in vars(defaults).items()}  # as training read them
    )
    try:
        use_fast, trust = (_config_value(config, key, default) for key, default in FOLDER_KEYS)
        processor = load_processor(model_folder(config.model), use_fast, trust)
        return get_plugin(template, processor, tokenizer, settings), None
    except ValueError as error:
        return None, f"{config.model.model_name_or_path}: it takes no images here: {error}"


FOLDER_KEYS = (("use_fast_tokenizer", True), ("trust_remote_code", False))  # how the model folder's processor loads


def _config_value(config, key: str, default):
    """A multimodal key of the inference config (LLaMA-Factory keeps them with the model arguments), else its
    default: the same budget training read."""
    for section in (config.model, config.data):
        value = getattr(section, key, None)
        if value is not None:
            return value
    return default


def load_image_processor(model_args):
    """The image processor saved in the model folder (preprocessor_config.json)."""
    from transformers import AutoImageProcessor

    from lathe.llm.hub import model_folder

    folder = model_folder(model_args)
    try:
        return AutoImageProcessor.from_pretrained(
            folder, trust_remote_code=model_args.trust_remote_code, local_files_only=True
        )
    except (OSError, ValueError) as error:
        raise OSError(f"no image processor in {folder} (preprocessor_config.json): {error}") from None


def probe_image():
    """A small drawn image (a gradient with a checker pattern) for export's checks: the vision tower's weights
    are compared too, not only the language model's."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:56, 0:84]
    pixels = np.stack([(x * 3) % 256, (y * 5) % 256, ((x // 7 + y // 7) % 2) * 255], -1)
    return Image.fromarray(pixels.astype("uint8"), "RGB")


def image_probe(config, model, tokenizer, template) -> dict | None:
    """Export's probe with an image (None for a model that takes none): the model's inputs for one user turn
    holding the probe image, encoded as served, with the 3-D positions training gives the family."""
    import torch

    from lathe.llm.multimodal.mrope import rope_positions

    encoder = load_image_encoder(config, model, template, tokenizer)
    if encoder.refusal is not None:
        return None
    turns, media = encoder.encode([{"role": "user", "content": "Describe the image."}], [probe_image()])
    prompt_ids, _ = template.encode_oneturn(tokenizer, turns + [{"role": "assistant", "content": ""}])
    if encoder.plugin is not None:
        prompt_ids, media = encoder.finish(prompt_ids, media, model)
        return {"input_ids": torch.tensor([prompt_ids]), **media}
    input_ids = torch.tensor([prompt_ids])
    position_ids, _ = rope_positions(model, input_ids, torch.ones_like(input_ids), media["image_grid_thw"])
    return {"input_ids": input_ids, "position_ids": position_ids, **media}


def save_processor(model_args, model, export_dir: str) -> bool:
    """Write a vision-language model's processor files into export_dir (before the tokenizer, whose files then
    win): the whole processor when transformers can build it here, else its image processor
    (preprocessor_config.json). False for a text-only model."""
    if getattr(model.config, "vision_config", None) is None:
        return False
    from transformers import AutoProcessor, ProcessorMixin

    from lathe.llm.hub import model_folder

    try:
        processor = AutoProcessor.from_pretrained(
            model_folder(model_args), trust_remote_code=model_args.trust_remote_code, local_files_only=True
        )
    except Exception:  # noqa: BLE001 (a video processor needing torchvision, ...: the image processor is saved alone)
        processor = None
    if isinstance(processor, ProcessorMixin):
        processor.save_pretrained(export_dir)
        return True
    load_image_processor(model_args).save_pretrained(export_dir)
    import os
    import shutil

    folder = model_folder(model_args)
    for name in PROCESSOR_FILES:  # the rest of the processor, as the base model has it, for a machine that builds it
        if os.path.isfile(os.path.join(folder, name)) and not os.path.exists(os.path.join(export_dir, name)):
            shutil.copy(os.path.join(folder, name), os.path.join(export_dir, name))
    return True
