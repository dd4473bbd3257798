"""The Pixtral / Mistral-Small family (pixtral, mistral_small, ministral3 templates) as LLaMA-Factory 0.9.5 encodes
images: each image is resized to the processor's longest edge (patch-aligned), and its `<image>` becomes one row of
`[IMG]` tokens per patch row, each row closed by `[IMG_BREAK]`, the last by `[IMG_END]`. The collator adds
pixel_values (padded to the batch's largest image) and image_sizes.

transformers' PixtralProcessor needs torchvision (its image processor does not: the PIL backend serves); the
attributes read here are the processor's, so without torchvision the run stops naming what is missing."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, image_processor_inputs, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "[IMG]", None
COMPOSITES = {
    "llava": composite(),
    "mistral3": composite(projector=("model.multi_modal_projector",)),
}  # as LLaMA-Factory registers them
PROCESSOR_ATTRIBUTES = ("patch_size", "image_break_token", "image_end_token")


def check_processor(processor) -> None:
    missing = [name for name in PROCESSOR_ATTRIBUTES if not hasattr(processor, name)]
    if missing:
        raise ValueError(
            f"the pixtral family needs the model's PixtralProcessor (it has {', '.join(PROCESSOR_ATTRIBUTES)}); "
            f"{type(processor).__name__} lacks {', '.join(missing)}. transformers builds PixtralProcessor only with "
            "torchvision installed: pip install torchvision (built for your torch)"
        )


def check_sizes(sizes: list, processor) -> None:
    """Mistral3 (spatial_merge_size 2) folds each 2x2 block of patches into one token: an image the processor made
    smaller than one block on a side has no token there. LLaMA-Factory 0.9.5 stops on it (an IndexError, or the model's
    unfold error where only the width is short); refuse it here, where the fix can be named."""
    block = processor.patch_size * getattr(processor, "spatial_merge_size", 1)
    for index, (height, width) in enumerate(sizes):
        if height < block or width < block:
            raise ValueError(
                f"the pixtral family reads images in blocks of {block}x{block} pixels (patch_size x "
                f"spatial_merge_size), but image {index + 1} of the row was resized to {height}x{width} pixels (height x width): "
                f"the model cannot read it. Raise image_min_pixels (each side must reach {block} pixels) or pad "
                "the image"
            )


def image_tokens(height: int, width: int, processor) -> str:
    """`[IMG]` x patch columns + `[IMG_BREAK]`, once per patch row; the last break is `[IMG_END]`."""
    patch = processor.patch_size * getattr(processor, "spatial_merge_size", 1)
    rows = [IMAGE_TOKEN * (width // patch) + processor.image_break_token] * (height // patch)
    text = "".join(rows)
    return text[: -len(processor.image_break_token)] + processor.image_end_token


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` replaced by its rows of image tokens (from the processed image's height and width)."""
    check_processor(processor)
    if not images:
        return [dict(message) for message in messages]
    sizes = image_processor_inputs(images, processor, settings)["image_sizes"].tolist()
    check_sizes(sizes, processor)
    return placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: image_tokens(*sizes[k], processor))


def media_tokens(processor) -> tuple[str, ...]:
    return (IMAGE_TOKEN, processor.image_break_token, processor.image_end_token)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """pixel_values (images, 3, height, width: padded to the largest) and image_sizes (height, width) per image."""
    return image_processor_inputs(images, processor, settings)


class PixtralPlugin(ModulePlugin):
    """LLaMA-Factory's Pixtral plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "pixtral"
    requires = ("torchvision", "transformers' PixtralProcessor")
