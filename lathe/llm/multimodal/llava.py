"""The LLaVA-1.5 family (llava template; yi_vl too) as LLaMA-Factory 0.9.5 encodes images: every image is the
processor's fixed crop, so each `<image>` becomes the same number of `<image>` tokens: the vision tower's
patches, plus its extra tokens (CLS), less one when the model drops CLS (vision_feature_select_strategy
"default"). The collator adds pixel_values."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, image_processor_inputs, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<image>", None
COMPOSITES = {"llava": composite()}  # as LLaMA-Factory registers them


def image_token_count(pixel_values, processor) -> int:
    """Vision tokens per image from the processed height and width (LlavaProcessor's arithmetic)."""
    height, width = pixel_values.shape[-2:]
    count = (height // processor.patch_size) * (width // processor.patch_size) + processor.num_additional_image_tokens
    return count - 1 if processor.vision_feature_select_strategy == "default" else count


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` repeated as many times as the image has vision tokens."""
    if not images:
        return [dict(message) for message in messages]
    count = image_token_count(image_processor_inputs(images, processor, settings)["pixel_values"][0], processor)
    return placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: IMAGE_TOKEN * count)


def media_tokens(processor) -> tuple[str, ...]:
    return (IMAGE_TOKEN,)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """pixel_values (images, 3, height, width) of the batch's images in row order."""
    return image_processor_inputs(images, processor, settings)


class LlavaPlugin(ModulePlugin):
    """LLaMA-Factory's LLaVA-1.5 plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "llava"
