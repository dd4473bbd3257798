"""The LFM2-VL / LFM2.5-VL family (lfm2_vl template) as LLaMA-Factory 0.9.5 encodes images: the image processor gives
each image's patch grid (spatial_shapes: rows, columns), and each `<image>` becomes `<image>` x (rows * columns /
downsample_factor^2). The collator adds the image processor's tensors (pixel_values, spatial_shapes,
pixel_attention_mask).

transformers' Lfm2VlImageProcessor needs torchvision (it has no PIL backend): a run without it stops naming it."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, image_processor_inputs, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<image>", None
COMPOSITES: dict = {}  # LLaMA-Factory registers none for lfm2_vl: no part is frozen (its freeze_* keys do nothing)
WHOLE_MODEL_TYPES = ("lfm2_vl",)  # a vision-language model all the same (towers.is_vision_language)


def check_processor(processor) -> None:
    if getattr(processor, "image_processor", None) is None:
        raise ValueError(
            f"the lfm2_vl family needs the model's Lfm2VlProcessor; {type(processor).__name__} has no image processor. "
            "transformers builds Lfm2VlImageProcessor only with torchvision installed: pip install torchvision"
        )


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """Each `<image>` repeated once per downsampled patch of its image."""
    check_processor(processor)
    if not images:
        return [dict(message) for message in messages]
    shapes = image_processor_inputs(images, processor, settings)["spatial_shapes"].tolist()
    if len(shapes) != len(images):
        # Lfm2VlImageProcessor splits an image over its token budget into tiles (and a thumbnail): one shape each.
        # LLaMA-Factory 0.9.5 still reads the k-th shape for the k-th image, so its counts miss the tiles and the
        # model stops on features that outnumber the tokens; refuse here, where the fix can be named
        raise ValueError(
            f"the lfm2_vl image processor split an image into tiles ({len(shapes)} tiles for {len(images)} images): "
            "LLaMA-Factory 0.9.5 counts one tile's tokens per image, which the model cannot read. Lower "
            "image_max_pixels so each image stays under the processor's max_image_tokens, or set "
            "do_image_splitting: false in the model's preprocessor_config.json"
        )
    factor = getattr(processor.image_processor, "downsample_factor", 2)
    return placeholder_runs(
        messages, IMAGE_PLACEHOLDER, lambda k: IMAGE_TOKEN * (shapes[k][0] * shapes[k][1] // factor**2)
    )


def media_tokens(processor) -> tuple[str, ...]:
    return (IMAGE_TOKEN,)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """The image processor's tensors of the batch's images in row order."""
    return image_processor_inputs(images, processor, settings)


class Lfm2VlPlugin(ModulePlugin):
    """LLaMA-Factory's LFM2-VL plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "lfm2_vl"
    requires = ("torchvision", "transformers' Lfm2VlImageProcessor")
