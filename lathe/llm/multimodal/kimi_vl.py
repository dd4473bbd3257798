"""The Kimi-VL family (kimi_vl template) as LLaMA-Factory 0.9.5 encodes images: the model's image processor gives
pixel_values and image_grid_hws (patch rows and columns per image), and each `<image>` becomes
`<|media_start|>image<|media_content|>` + `<|media_pad|>` x (rows * columns / the merge kernel's area) +
`<|media_end|>`. The collator adds the image processor's tensors.

Kimi-VL's processor is the model folder's own code (KimiVLImageProcessor, not in transformers): it loads only with
trust_remote_code: true, and a run without it stops naming that."""

from __future__ import annotations

import math

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, image_processor_inputs, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<|media_pad|>", None
START, CONTENT, END = "<|media_start|>", "<|media_content|>", "<|media_end|>"
COMPOSITES = {"kimi_vl": composite()}  # as LLaMA-Factory registers it (the default parts)


def check_processor(processor) -> None:
    image_processor = getattr(processor, "image_processor", None)
    if getattr(image_processor, "merge_kernel_size", None) is None:
        raise ValueError(
            f"the kimi_vl family needs the model's own processor (KimiVLImageProcessor, code in the model folder, with "
            f"merge_kernel_size); {type(processor).__name__} is not it: set trust_remote_code: true to load it"
        )


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` replaced by its media run (one pad per merged patch)."""
    check_processor(processor)
    if not images:
        return [dict(message) for message in messages]
    grids = image_processor_inputs(images, processor, settings)["image_grid_hws"]
    merge = math.prod(processor.image_processor.merge_kernel_size)
    runs = [f"{START}image{CONTENT}{IMAGE_TOKEN * (int(grid.prod()) // merge)}{END}" for grid in grids]
    return placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: runs[k])


def media_tokens(processor) -> tuple[str, ...]:
    return (IMAGE_TOKEN, END)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """The image processor's pixel_values and image_grid_hws of the batch's images in row order."""
    return image_processor_inputs(images, processor, settings)


class KimiVLPlugin(ModulePlugin):
    """LLaMA-Factory's Kimi-VL plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "kimi_vl"
