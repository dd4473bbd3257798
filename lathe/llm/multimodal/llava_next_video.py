"""The LLaVA-NeXT-Video family (llava_next_video templates: vicuna, mistral, yi) as LLaMA-Factory 0.9.5 encodes images
and videos: an image as LLaVA-NeXT tiles it (any resolution: LlavaNextProcessor's feature count, less one with
vision_feature_select_strategy "default"); a video as its frames, each the video processor's crop, pooled 2x2 by the
model, so `<video>` becomes (crop / patch_size)^2 / 4 `<video>` tokens per frame. The collator adds pixel_values and
image_sizes for images, pixel_values_videos (videos, frames, 3, height, width) for videos.

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
COMPOSITES = {"llava_next_video": composite()}  # as LLaMA-Factory registers them
POOLING = 4  # the model's 2x2 average pooling of each frame's patches (LLaMA-Factory's fixed divisor)


def video_inputs(videos, processor) -> dict:
    """pixel_values_videos of the videos' sampled frames (none: {})."""
    if not videos:
        return {}
    return dict(video_processor_of(processor)([video.frames for video in videos], return_tensors="pt"))


def image_tokens(images, processor, settings: MediaSettings) -> list[int]:
    """Vision tokens of each image at its original size (LlavaNextProcessor's count of base and unpadded tiles)."""
    if not images:
        return []
    inputs = image_processor_inputs(images, processor, settings)
    height, width = inputs["pixel_values"][0][0].shape[-2:]
    drop = 1 if processor.vision_feature_select_strategy == "default" else 0
    return [
        processor._get_number_of_features(original_height, original_width, height, width) - drop
        for original_height, original_width in inputs["image_sizes"].tolist()
    ]


def video_tokens(videos, processor) -> list[int]:
    """Vision tokens of each video: its frames times the pooled patches of one frame."""
    if not videos:
        return []
    height, width = video_inputs(videos, processor)["pixel_values_videos"].shape[-2:]
    per_frame = (height // processor.patch_size) * (width // processor.patch_size) // POOLING
    return [per_frame * len(video.frames) for video in videos]


def process_messages(messages, images, audios, processor, settings: MediaSettings, videos=()) -> list[dict]:
    """Each `<image>` and `<video>` repeated as many times as the medium has vision tokens."""
    counts = image_tokens(images, processor, settings)
    messages = placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: IMAGE_TOKEN * counts[k])
    frames = video_tokens(list(videos), processor)
    return placeholder_runs(messages, VIDEO_PLACEHOLDER, lambda k: VIDEO_TOKEN * frames[k])


def media_tokens(processor) -> tuple[str, ...]:
    return (IMAGE_TOKEN, VIDEO_TOKEN)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings, videos=()) -> dict:
    """pixel_values and image_sizes of the images (LLaVA-NeXT's), pixel_values_videos of the videos."""
    return {**image_processor_inputs(images, processor, settings), **video_inputs(list(videos), processor)}


class LlavaNextVideoPlugin(ModulePlugin):
    """LLaMA-Factory's LLaVA-NeXT-Video plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "llava_next_video"
    requires = ("torchvision", "transformers' LlavaNextVideoProcessor, whose video processor is built on it")
