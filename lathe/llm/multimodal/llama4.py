"""The Llama 4 family (llama4 template) as LLaMA-Factory 0.9.5 encodes images: the image processor cuts each image
into tiles (pixel_values: every image's tiles, plus a global one for a tiled image; aspect_ratios: tile rows and
columns), and each `<image>` becomes Llama4Processor's layout: `<|image_start|>`, per tile row the tiles' patch
tokens split by `<|tile_x_separator|>` and ended by `<|tile_y_separator|>` (only for a tiled image), then
`<|image|>`, the global tile's patch tokens and `<|image_end|>`; a tile has (tile side / patch)^2 / downsample
ratio `<|patch|>` tokens. The collator adds pixel_values (aspect_ratios is dropped, as LLaMA-Factory drops it).

transformers' Llama4ImageProcessor needs torchvision (it has no PIL backend): a run without it stops naming it."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, image_processor_inputs, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<|image|>", None
START, END, PATCH, TILE_X, TILE_Y = (
    "<|image_start|>",
    "<|image_end|>",
    "<|patch|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
)
COMPOSITES = {"llama4": composite(vision=("vision_model",))}  # as LLaMA-Factory registers it
PROCESSOR_ATTRIBUTES = ("patch_size", "downsample_ratio")


def check_processor(processor) -> None:
    missing = [name for name in PROCESSOR_ATTRIBUTES if not hasattr(processor, name)]
    if missing:
        raise ValueError(
            f"the llama4 family needs the model's Llama4Processor (it has {', '.join(PROCESSOR_ATTRIBUTES)}); "
            f"{type(processor).__name__} lacks {', '.join(missing)}. transformers builds Llama4Processor only with "
            "torchvision installed: pip install torchvision (built for your torch)"
        )


def image_tokens(aspect_ratio, patches_per_tile: int) -> str:
    """One image's tokens (Llama4Processor._prompt_split_image's layout)."""
    rows, columns = (int(side) for side in aspect_ratio)
    text = START
    if rows * columns > 1:
        for _ in range(rows):
            text += TILE_X.join([PATCH * patches_per_tile] * columns) + TILE_Y
    return text + IMAGE_TOKEN + PATCH * patches_per_tile + END


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` replaced by its tiles' tokens (from the processed tile size and the image's aspect ratio)."""
    check_processor(processor)
    if not images:
        return [dict(message) for message in messages]
    inputs = image_processor_inputs(images, processor, settings)
    height, width = inputs["pixel_values"][0].shape[-2:]
    patches = (height // processor.patch_size) * (width // processor.patch_size) // processor.downsample_ratio
    ratios = inputs["aspect_ratios"]
    return placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: image_tokens(ratios[k], int(patches)))


def media_tokens(processor) -> tuple[str, ...]:
    return (IMAGE_TOKEN, PATCH, END)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """pixel_values (every image's tiles, in row order); aspect_ratios left out as LLaMA-Factory leaves it."""
    inputs = image_processor_inputs(images, processor, settings)
    inputs.pop("aspect_ratios", None)
    return inputs


class Llama4Plugin(ModulePlugin):
    """LLaMA-Factory's Llama 4 plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "llama4"
    requires = ("torchvision", "transformers' Llama4ImageProcessor")
