"""The Gemma 3n family (gemma3n template) as LLaMA-Factory 0.9.5 encodes images and audio: `<image>` becomes the
processor's full image sequence, `<audio>` its full audio sequence ("\\n\\n<start_of_audio>" + audio_seq_length
soft tokens + "<end_of_audio>\\n\\n"). The collator adds pixel_values, input_features with input_features_mask
(the extractor's name; `feature_attention_mask` stays None, as LLaMA-Factory passes it) and token_type_ids (1 on
the image soft tokens). A batch without images gets the stand-in image, one without audio the stand-in audio."""

from __future__ import annotations

from lathe.llm.multimodal.common import (
    MediaSettings,
    ModulePlugin,
    audio_processor_inputs,
    composite,
    image_processor_inputs,
    placeholder_runs,
)
from lathe.llm.multimodal.gemma3 import token_type_ids
from lathe.llm.multimodal.images import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<image_soft_token>", "<audio_soft_token>"
COMPOSITES = {  # as LLaMA-Factory registers them
    "gemma3n": composite(
        vision=("vision_tower", "audio_tower"), lora_conflict=("timm_model", "subsample_conv_projection")
    )
}


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` and `<audio>` replaced by the processor's full sequence of its kind."""
    if settings.image_do_pan_and_scan:
        raise ValueError("image_do_pan_and_scan: the gemma3n family has no such option (Gemma 3 has)")
    messages = placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: processor.full_image_sequence)
    return placeholder_runs(messages, AUDIO_PLACEHOLDER, lambda k: processor.full_audio_sequence)


def media_tokens(processor) -> tuple[str, ...]:
    tokenizer = processor.tokenizer
    return (
        tokenizer.boi_token,
        IMAGE_TOKEN,
        tokenizer.eoi_token,
        tokenizer.boa_token,
        AUDIO_TOKEN,
        tokenizer.eoa_token,
    )


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """pixel_values, input_features / input_features_mask, and the rows' token_type_ids."""
    inputs = image_processor_inputs(images, processor, settings)
    inputs.update(audio_processor_inputs(audios, processor, settings))
    inputs["token_type_ids"] = token_type_ids(batch_ids, processor.tokenizer.image_token_id)
    return inputs


class Gemma3nPlugin(ModulePlugin):
    """LLaMA-Factory's Gemma 3n plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "gemma3n"
    requires = ("timm", "its vision tower (a timm model)")
