"""The InternVL family (intern_vl, intern_s1 templates) as LLaMA-Factory 0.9.5 encodes images: each image is one
tile (or, with crop_to_patches, up to 12 tiles plus a thumbnail) of the processor's size, and its `<image>`
becomes `<img>` + `<IMG_CONTEXT>` x (image_seq_length x tiles) + `</img>`. The collator adds pixel_values (all
tiles in image order). Video is not supported yet (its processor needs torchvision)."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, fit_images, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<image>", None
COMPOSITES = {"internvl": composite(), "interns1": composite()}  # as LLaMA-Factory registers them
CONTEXT_TOKEN, START, END = "<IMG_CONTEXT>", "<img>", "</img>"
CROP_TO_PATCHES = {"crop_to_patches": True, "max_patches": 12, "min_patches": 1}  # LLaMA-Factory's fixed values


def tiles(images, processor, settings: MediaSettings) -> dict:
    """The image processor's pixel_values and num_patches (tiles per image)."""
    kwargs = dict(CROP_TO_PATCHES) if settings.crop_to_patches else {}
    return dict(processor.image_processor(images=fit_images(images, settings), return_tensors="pt", **kwargs))


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` replaced by its context tokens between `<img>` and `</img>`."""
    if not images:
        return [dict(message) for message in messages]
    counts = tiles(images, processor, settings)["num_patches"]
    length = processor.image_seq_length
    return placeholder_runs(
        messages, IMAGE_PLACEHOLDER, lambda k: f"{START}{CONTEXT_TOKEN * length * int(counts[k])}{END}"
    )


def media_tokens(processor) -> tuple[str, ...]:
    return (START, CONTEXT_TOKEN, END)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """pixel_values: every image's tiles, in image order."""
    if not images:
        return {}
    return {"pixel_values": tiles(images, processor, settings)["pixel_values"]}


class InternVLPlugin(ModulePlugin):
    """LLaMA-Factory's InternVL plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "intern_vl"
    options = ("crop_to_patches",)
    requires = ("torchvision", "transformers' InternVLProcessor")
