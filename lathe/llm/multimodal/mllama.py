"""The Llama 3.2 Vision family (mllama template) as LLaMA-Factory 0.9.5 encodes images: `<image>` becomes one
`<|image|>` token (the images enter through cross-attention, not as tokens); the image processor tiles each
image (pixel_values: rows, images, tiles, 3, height, width; aspect_ratio_ids and aspect_ratio_mask) and the
collator adds cross_attention_mask (rows, length, images, tiles): which text tokens see which image's tiles,
from transformers' own mllama helpers."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, image_processor_inputs, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<|image|>", None
COMPOSITES = {"mllama": composite(vision=("vision_model",))}  # as LLaMA-Factory registers them


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` replaced by one `<|image|>`."""
    return placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: IMAGE_TOKEN)


def media_tokens(processor) -> tuple[str, ...]:
    return (IMAGE_TOKEN,)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """The image processor's tensors for the images nested by row, and the dense cross_attention_mask over the
    longest row (the collator pads it to the batch length)."""
    import torch
    from transformers.models.mllama.processing_mllama import (
        convert_sparse_cross_attention_mask_to_dense,
        get_cross_attention_token_mask,
    )

    inputs = image_processor_inputs(images, processor, settings, counts["image"])
    if not inputs:
        return inputs
    num_tiles = inputs.pop("num_tiles")
    masks = [get_cross_attention_token_mask(ids, processor.image_token_id) for ids in batch_ids]
    dense = convert_sparse_cross_attention_mask_to_dense(
        masks,
        num_tiles=num_tiles,
        max_num_tiles=processor.image_processor.max_image_tiles,
        length=max(len(ids) for ids in batch_ids),
    )
    inputs["cross_attention_mask"] = torch.from_numpy(dense)
    return inputs


class MllamaPlugin(ModulePlugin):
    """LLaMA-Factory's Llama 3.2 Vision plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "mllama"
