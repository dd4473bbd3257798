"""The LLaVA-NeXT family (llava_next and its llama3 / mistral / qwen / yi variants, granite3_vision) as
LLaMA-Factory 0.9.5 encodes images: each image is tiled at the best of the processor's grid pinpoints (any
resolution), and its `<image>` becomes as many `<image>` tokens as the tiles and the base image give after
the unpadding LLaVA-NeXT does (LlavaNextProcessor's own count), less one with vision_feature_select_strategy
"default". The collator adds pixel_values (images, tiles, 3, height, width) and image_sizes."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, image_processor_inputs, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<image>", None
COMPOSITES = {"llava_next": composite()}  # as LLaMA-Factory registers them


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` repeated as many times as that image has vision tokens at its original size."""
    if not images:
        return [dict(message) for message in messages]
    inputs = image_processor_inputs(images, processor, settings)
    height, width = inputs["pixel_values"][0][0].shape[-2:]
    sizes = inputs["image_sizes"].tolist()

    def tokens(index: int) -> str:
        original_height, original_width = sizes[index]
        # the processor's count of base + unpadded tile features (what the model's image features will be)
        count = processor._get_number_of_features(original_height, original_width, height, width)
        return IMAGE_TOKEN * (count - 1 if processor.vision_feature_select_strategy == "default" else count)

    return placeholder_runs(messages, IMAGE_PLACEHOLDER, tokens)


def media_tokens(processor) -> tuple[str, ...]:
    return (IMAGE_TOKEN,)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """pixel_values (tiles padded to the batch's most) and image_sizes (original height, width) per image."""
    return image_processor_inputs(images, processor, settings)


class LlavaNextPlugin(ModulePlugin):
    """LLaMA-Factory's LLaVA-NeXT plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "llava_next"
