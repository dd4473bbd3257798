"""The Youtu-VL family (youtu_vl template) as LLaMA-Factory 0.9.5 encodes it: each `<image>` becomes ONE
`<|vision_start|><|image_pad|><|vision_end|>` and each `<video>` one `<|vision_start|><|video_pad|><|vision_end|>`
(not repeated per patch: Youtu-VL's own model code expands them), and the collator adds the image processor's (and
the video processor's) tensors as they come.

Youtu-VL's processor and model are the model folder's own code (not in transformers): they load only with
trust_remote_code: true. LLaMA-Factory registers no composite model for youtu_vl: no part is frozen (its freeze_*
keys do nothing)."""

from __future__ import annotations

from lathe.llm.multimodal.common import (
    MediaSettings,
    ModulePlugin,
    image_processor_inputs,
    placeholder_runs,
    video_processor_of,
)
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

WHOLE_MODEL_TYPES = (
    "youtu_vl",
)  # no composite, trained whole, yet a vision-language model (towers.is_vision_language)

IMAGE_TOKEN, VIDEO_TOKEN, AUDIO_TOKEN = "<|image_pad|>", "<|video_pad|>", None
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
COMPOSITES: dict = {}


def check_processor(processor) -> None:
    if getattr(processor, "image_processor", None) is None:
        raise ValueError(
            f"the youtu_vl family needs the model's own processor (code in the model folder, with an image "
            f"processor); {type(processor).__name__} has none: set trust_remote_code: true to load it"
        )


def process_messages(messages, images, audios, processor, settings: MediaSettings, videos=()) -> list[dict]:
    """Each `<image>` / `<video>` replaced by its one pad token between the vision start and end tokens."""
    check_processor(processor)
    messages = placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: f"{VISION_START}{IMAGE_TOKEN}{VISION_END}")
    return placeholder_runs(messages, VIDEO_PLACEHOLDER, lambda k: f"{VISION_START}{VIDEO_TOKEN}{VISION_END}")


def media_tokens(processor) -> tuple[str, ...]:
    return (VISION_START, IMAGE_TOKEN, VIDEO_TOKEN, VISION_END)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings, videos=()) -> dict:
    """The image processor's tensors of the batch's images and the video processor's of its videos' sampled
    frames (called with the videos only: transformers 5's video processors refuse LLaMA-Factory's images=None)."""
    inputs = image_processor_inputs(images, processor, settings)
    if videos:
        frames = [video.frames for video in videos]
        inputs.update(dict(video_processor_of(processor)(videos=frames, return_tensors="pt")))
    return inputs


class YoutuVLPlugin(ModulePlugin):
    """LLaMA-Factory's Youtu-VL plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "youtu_vl"
