"""The Video-LLaVA family (video_llava template) as LLaMA-Factory 0.9.5 encodes images and videos: every image and
frame is the processor's fixed crop; `<image>` becomes the vision tower's patches plus its extra tokens (CLS), less
one with vision_feature_select_strategy "default", and `<video>` the patches plus the extra tokens of every frame (the
model keeps CLS for videos). The collator adds pixel_values_images and pixel_values_videos (videos, frames, 3,
height, width).

LLaMA-Factory counts every video's tokens from the first video's frames; lathe counts each video's own (the same when
a batch's videos have one frame count, which the video processor needs to stack them). LLaMA-Factory 0.9.5 passes
images=None to the video processor, which transformers 5 refuses (TypeError); lathe calls it with the videos only."""

from __future__ import annotations

from lathe.llm.multimodal.common import (
    MediaSettings,
    ModulePlugin,
    composite,
    image_processor_inputs,
    placeholder_runs,
    video_processor_of,
)
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

IMAGE_TOKEN, VIDEO_TOKEN, AUDIO_TOKEN = "<image>", "<video>", None
COMPOSITES = {"video_llava": composite(vision=("video_tower", "image_tower"))}  # as LLaMA-Factory registers them


def video_inputs(videos, processor) -> dict:
    """pixel_values_videos of the videos' sampled frames (none: {})."""
    if not videos:
        return {}
    return dict(video_processor_of(processor)([video.frames for video in videos], return_tensors="pt"))


def frame_tokens(pixels, processor) -> int:
    """Vision tokens of one crop (the last two sides of `pixels`): patches plus the tower's extra tokens."""
    height, width = pixels.shape[-2:]
    return (height // processor.patch_size) * (width // processor.patch_size) + processor.num_additional_image_tokens


def process_messages(messages, images, audios, processor, settings: MediaSettings, videos=()) -> list[dict]:
    """Each `<image>` and `<video>` repeated as many times as the medium has vision tokens."""
    if images:
        pixels = image_processor_inputs(images, processor, settings)["pixel_values_images"]
        count = frame_tokens(pixels, processor) - (1 if processor.vision_feature_select_strategy == "default" else 0)
        messages = placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: IMAGE_TOKEN * count)
    if videos:
        per_frame = frame_tokens(video_inputs(list(videos), processor)["pixel_values_videos"], processor)
        messages = placeholder_runs(
            messages, VIDEO_PLACEHOLDER, lambda k: VIDEO_TOKEN * per_frame * len(videos[k].frames)
        )
    return [dict(message) for message in messages]


def media_tokens(processor) -> tuple[str, ...]:
    return (IMAGE_TOKEN, VIDEO_TOKEN)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings, videos=()) -> dict:
    """pixel_values_images of the images, pixel_values_videos of the videos."""
    return {**image_processor_inputs(images, processor, settings), **video_inputs(list(videos), processor)}


class VideoLlavaPlugin(ModulePlugin):
    """LLaMA-Factory's Video-LLaVA plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "video_llava"
    requires = ("torchvision", "transformers' VideoLlavaProcessor, whose video processor is built on it")
