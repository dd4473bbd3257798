"""The InternVL family (intern_vl, intern_s1 templates) as LLaMA-Factory 0.9.5 encodes images and videos: each image
is one tile (or, with crop_to_patches, up to 12 tiles plus a thumbnail) of the processor's size, and its `<image>`
becomes `<img>` + `<IMG_CONTEXT>` x (image_seq_length x tiles) + `</img>`; a video's frames (sampled with PyAV, fitted
into the video pixel budget) are one tile each through the same image processor, and its `<video>` becomes
"Frame1: <img>...</img>" lines joined by newlines. The collator adds pixel_values: each row's image tiles, then its
video frames.

LLaMA-Factory puts a batch's images before all its videos whatever the rows (its "NOT SUPPORT IMAGE VIDEO
INTERLEAVED"), which gives the model another row's pixels where an image row follows a video row; lathe keeps each
row's media with its row (the same pixel_values wherever LLaMA-Factory's order is the text's). A row with a `<video>`
before an `<image>` is refused (the model would read the image's pixels for the video's tokens, in both)."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, fit_images, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

IMAGE_TOKEN, VIDEO_TOKEN, AUDIO_TOKEN = "<image>", "<video>", None
COMPOSITES = {"internvl": composite(), "interns1": composite()}  # as LLaMA-Factory registers them
CONTEXT_TOKEN, START, END = "<IMG_CONTEXT>", "<img>", "</img>"
CROP_TO_PATCHES = {"crop_to_patches": True, "max_patches": 12, "min_patches": 1}  # LLaMA-Factory's fixed values


def tiles(images, processor, settings: MediaSettings) -> dict:
    """The image processor's pixel_values and num_patches (tiles per image)."""
    kwargs = dict(CROP_TO_PATCHES) if settings.crop_to_patches else {}
    return dict(processor.image_processor(images=fit_images(images, settings), return_tensors="pt", **kwargs))


def frame_tiles(videos, processor, settings: MediaSettings) -> dict:
    """pixel_values and num_patches (one per frame) of the videos' frames, in order (never cropped to patches)."""
    kwargs = {**CROP_TO_PATCHES, "crop_to_patches": False} if settings.crop_to_patches else {}
    frames = [list(video.frames) for video in videos]
    return dict(processor.image_processor(images=frames, return_tensors="pt", **kwargs))


def check_order(messages) -> None:
    text = "".join(message["content"] for message in messages)
    video, image = text.find(VIDEO_PLACEHOLDER), text.rfind(IMAGE_PLACEHOLDER)
    if video != -1 and image > video:
        raise ValueError(
            f"the intern_vl family takes a row's images before its videos: a {IMAGE_PLACEHOLDER} after a "
            f"{VIDEO_PLACEHOLDER} would read the wrong pixels (LLaMA-Factory's order too); put the images first"
        )


def process_messages(messages, images, audios, processor, settings: MediaSettings, videos=()) -> list[dict]:
    """Each `<image>` replaced by its context tokens between `<img>` and `</img>`, each `<video>` by a line per frame."""
    length, videos = processor.image_seq_length, list(videos)
    if videos:
        check_order(messages)
    if images:
        counts = tiles(images, processor, settings)["num_patches"]
        messages = placeholder_runs(
            messages, IMAGE_PLACEHOLDER, lambda k: f"{START}{CONTEXT_TOKEN * length * int(counts[k])}{END}"
        )
    if videos:
        patches = [int(count) for count in frame_tiles(videos, processor, settings)["num_patches"]]
        starts = [sum(len(video.frames) for video in videos[:k]) for k in range(len(videos))]

        def frames(k: int) -> str:
            runs = patches[starts[k] : starts[k] + len(videos[k].frames)]
            return "\n".join(f"Frame{i + 1}: {START}{CONTEXT_TOKEN * length * n}{END}" for i, n in enumerate(runs))

        messages = placeholder_runs(messages, VIDEO_PLACEHOLDER, frames)
    return [dict(message) for message in messages]


def media_tokens(processor) -> tuple[str, ...]:
    return (START, CONTEXT_TOKEN, END)


def prefix_ids(images, tokenizer, processor) -> list[int]:
    return []


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings, videos=()) -> dict:
    """pixel_values: each row's image tiles, then its video frames, row by row."""
    import torch

    videos = list(videos)
    if not images and not videos:
        return {}
    image_part = tiles(images, processor, settings) if images else {"pixel_values": None, "num_patches": []}
    video_part = frame_tiles(videos, processor, settings) if videos else {"pixel_values": None}
    image_ends = [sum(int(n) for n in image_part["num_patches"][:k]) for k in range(len(images) + 1)]
    frame_ends = [sum(len(video.frames) for video in videos[:k]) for k in range(len(videos) + 1)]
    pieces, image_at, video_at = [], 0, 0
    for row_images, row_videos in zip(counts["image"], counts.get("video") or [0] * len(counts["image"])):
        if row_images:
            pieces.append(image_part["pixel_values"][image_ends[image_at] : image_ends[image_at + row_images]])
        if row_videos:
            pieces.append(video_part["pixel_values"][frame_ends[video_at] : frame_ends[video_at + row_videos]])
        image_at, video_at = image_at + row_images, video_at + row_videos
    return {"pixel_values": torch.cat(pieces)}


class InternVLPlugin(ModulePlugin):
    """LLaMA-Factory's InternVL plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "intern_vl"
    options = ("crop_to_patches",)
    requires = ("torchvision", "transformers' InternVLProcessor")
