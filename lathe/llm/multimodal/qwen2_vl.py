"""The Qwen2-VL family (qwen2_vl template: Qwen2-VL, Qwen2.5-VL) as LLaMA-Factory 0.9.5 encodes images and videos
(Qwen3-VL's videos: qwen3_vl.py).

- each image is fitted into image_min_pixels..image_max_pixels, then made at least 28 pixels a side and at
  most 200:1 (the vision tower's patches need it), and goes through the model's image processor
  (pixel_values: one row per 14x14 patch, image_grid_thw: (t, h, w) patches per image);
- `<image>` becomes `<|vision_start|>` + `<|image_pad|>` x (t*h*w / merge_size^2) + `<|vision_end|>`;
- `<video>` likewise with `<|video_pad|>`, its frames sampled by video.py (an odd count repeats the last), the grid
  counted from the stream's size without decoding (LLaMA-Factory's `_get_qwen_video_grid_metadata`);
- the collator adds 3-D rotary positions (temporal, height, width; "mrope") and rope_deltas, computed by
  the model's own get_rope_index (packed rows: per packed example, as LLaMA-Factory's neat packing; generation:
  none, generate() computes them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lathe.llm.multimodal.base import Composite, FamilyPlugin
from lathe.llm.multimodal.common import media_cut_reason as count_cut_reason
from lathe.llm.multimodal.images import (
    DEFAULT_IMAGE_MAX_PIXELS,
    DEFAULT_IMAGE_MIN_PIXELS,
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    fit_pixels,
    media_cut_reason,
    open_image,
)
from lathe.llm.multimodal.mrope import packed_rope_positions, rope_positions, sliced
from lathe.llm.multimodal.video import check_torchvision, read_video

VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
MIN_SIDE, MAX_ASPECT, ASPECT_SIDE = 28, 200, 180


def prepare_image(image, max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS, min_pixels: int = DEFAULT_IMAGE_MIN_PIXELS):
    """The pixel budget, then sides of at least 28 pixels, then no more than 200:1 (cut to 180:1)."""
    image = fit_pixels(image, max_pixels, min_pixels)
    if min(image.width, image.height) < MIN_SIDE:
        image = image.resize((max(image.width, MIN_SIDE), max(image.height, MIN_SIDE)))
    if image.width / image.height > MAX_ASPECT:
        image = image.resize((image.height * ASPECT_SIDE, image.height))
    if image.height / image.width > MAX_ASPECT:
        image = image.resize((image.width, image.width * ASPECT_SIDE))
    return image


def image_inputs(
    images: list,
    image_processor,
    max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS,
    min_pixels: int = DEFAULT_IMAGE_MIN_PIXELS,
) -> dict:
    """pixel_values and image_grid_thw of the images (none: {})."""
    if not images:
        return {}
    prepared = [prepare_image(image, max_pixels, min_pixels) for image in images]
    return dict(image_processor(prepared, return_tensors="pt"))


def expand_placeholders(messages: list[dict], image_grid_thw, merge_size: int) -> list[dict]:
    """The messages with each `<image>` replaced by its vision tokens, in order over all messages."""
    merge_length = merge_size**2
    expanded, used = [], 0
    for message in messages:
        content = message["content"]
        while IMAGE_PLACEHOLDER in content:
            if used >= len(image_grid_thw):
                raise ValueError(f"more {IMAGE_PLACEHOLDER} placeholders than images ({len(image_grid_thw)})")
            count = int(image_grid_thw[used].prod()) // merge_length
            content = content.replace(IMAGE_PLACEHOLDER, f"{VISION_START}{IMAGE_TOKEN * count}{VISION_END}", 1)
            used += 1
        expanded.append({**message, "content": content})
    return expanded


# Parameter-name parts of the family's towers, as LLaMA-Factory registers the qwen2_vl composite model.
VISION_TOWER_KEYS, PROJECTOR_KEYS, LANGUAGE_MODEL_KEYS = (
    ("visual.patch_embed", "visual.blocks"),
    ("visual.merger",),
    (
        "language_model",
        "lm_head",
    ),
)
LORA_CONFLICT_KEYS = ("patch_embed",)  # never a LoRA target unless asked: a 3-D convolution


def frozen_keys(
    freeze_vision_tower: bool = True, freeze_multi_modal_projector: bool = True, freeze_language_model: bool = False
) -> set[str]:
    """The name parts of the parameters full (and freeze) fine-tuning leaves untrained (LLaMA-Factory's defaults:
    the vision tower and the projector)."""
    keys = set()
    for frozen, names in (
        (freeze_vision_tower, VISION_TOWER_KEYS),
        (freeze_multi_modal_projector, PROJECTOR_KEYS),
        (freeze_language_model, LANGUAGE_MODEL_KEYS),
    ):
        if frozen:
            keys.update(names)
    return keys


def freeze_for_full_tuning(model, keys: set[str]) -> int:
    """requires_grad off for every parameter whose name holds one of `keys` (a substring, as LLaMA-Factory
    matches), on for the others; returns the number of trainable parameters."""
    trainable = 0
    for name, parameter in model.named_parameters():
        train = not any(key in name for key in keys)
        parameter.requires_grad_(train)
        trainable += parameter.numel() if train else 0
    return trainable


def lora_module_names(model, target_modules: list[str], frozen: set[str]) -> list[str]:
    """The modules LoRA wraps for named targets, as LLaMA-Factory picks them on this family: every module whose
    name holds a target and none of the frozen parts nor the patch embedding (so the vision tower and the
    projector get adapters only when their freeze_* key is false, and the 3-D patch convolution never)."""
    forbidden = set(frozen) | set(LORA_CONFLICT_KEYS)
    return [
        name
        for name, _ in model.named_modules()
        if any(target in name for target in target_modules) and not any(key in name for key in forbidden)
    ]


QWEN2_VL = Composite(VISION_TOWER_KEYS, PROJECTOR_KEYS, LANGUAGE_MODEL_KEYS, LORA_CONFLICT_KEYS)
STAND_IN_SIZE, STAND_IN_COLOR = (64, 64), (255, 255, 255)


def expand_videos(messages: list[dict], video_grid_thw, merge_size: int) -> list[dict]:
    """The messages with each `<video>` replaced by its vision tokens (video pads), in order over all messages."""
    merge_length, used, expanded = merge_size**2, 0, []
    for message in messages:
        content = message["content"]
        while VIDEO_PLACEHOLDER in content:
            count = int(video_grid_thw[used].prod()) // merge_length
            content = content.replace(VIDEO_PLACEHOLDER, f"{VISION_START}{VIDEO_TOKEN * count}{VISION_END}", 1)
            used += 1
        expanded.append({**message, "content": content})
    return expanded


def video_grid(video, video_processor, settings, qwen3: bool = False) -> list[int]:
    """(t, h, w) patches of a video from its stream's frame size and sample count, as LLaMA-Factory's Qwen2VLPlugin
    counts a video's tokens (`_get_qwen_video_grid_metadata`): the frame size after the pixel budget, the
    processor's smart_resize (Qwen3-VL's video smart_resize, which weighs the frame count, with `qwen3`), an even
    number of frames grouped by temporal_patch_size."""
    width, height = regularized_size(video.width, video.height, settings.video_max_pixels, settings.video_min_pixels)
    frames = video.sample_count + video.sample_count % 2
    size = video_processor.size
    size = size if isinstance(size, dict) else vars(size)
    patch, merge, temporal = video_processor.patch_size, video_processor.merge_size, video_processor.temporal_patch_size
    limits = {"factor": patch * merge, "min_pixels": size.get("shortest_edge"), "max_pixels": size.get("longest_edge")}
    if qwen3:
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as qwen3_resize

        resized = qwen3_resize(num_frames=frames, height=height, width=width, temporal_factor=temporal, **limits)
    else:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

        resized = smart_resize(height=height, width=width, **limits)
    resized_height, resized_width = resized
    return [math.ceil(frames / temporal), resized_height // patch, resized_width // patch]


def regularized_size(width: int, height: int, max_pixels: int, min_pixels: int) -> tuple[int, int]:
    """The frame size prepare_image makes, computed without resizing (LLaMA-Factory's arithmetic)."""
    for limit, too_far in ((max_pixels, lambda area: area > max_pixels), (min_pixels, lambda area: area < min_pixels)):
        if too_far(width * height):
            factor = math.sqrt(limit / (width * height))
            width, height = int(width * factor), int(height * factor)
    if min(width, height) < MIN_SIDE:
        width, height = max(width, MIN_SIDE), max(height, MIN_SIDE)
    if width / height > MAX_ASPECT:
        width = height * ASPECT_SIDE
    if height / width > MAX_ASPECT:
        height = width * ASPECT_SIDE
    return width, height


@dataclass
class Qwen2VLPlugin(FamilyPlugin):
    """LLaMA-Factory's Qwen2VLPlugin for images and videos (Qwen2-VL, Qwen2.5-VL)."""

    name = "qwen2_vl"
    kinds = ("image", "video")
    packs = True
    composites = {"qwen2_vl": QWEN2_VL, "qwen2_5_vl": QWEN2_VL}

    @property
    def image_processor(self):
        return getattr(self.processor, "image_processor", self.processor)

    @property
    def video_processor(self):
        """The processor's video processor; without one (transformers builds it only with torchvision), one line."""
        check_torchvision("a video row")
        processor = getattr(self.processor, "video_processor", None)
        if processor is None:
            raise ValueError(
                f"the model's processor ({type(self.processor).__name__}) has no video processor: load the model "
                "folder's processor with torchvision installed (processor_config.json / video_preprocessor_config.json)"
            )
        return processor

    def regularize(self, kind: str, items: list, where: str = "") -> list:
        s = self.settings
        if kind == "video":
            videos = []
            for item in items:
                try:
                    video = read_video(item, s.video_fps, s.video_maxlen, even=True)
                except (OSError, ValueError) as error:
                    raise ValueError(f"{where}: {error}") from None
                video.frames = [prepare_image(frame, s.video_max_pixels, s.video_min_pixels) for frame in video.frames]
                videos.append(video)
            return videos
        if kind != "image":
            return super().regularize(kind, items, where)
        return [prepare_image(open_image(item, None, where), s.image_max_pixels, s.image_min_pixels) for item in items]

    def _grid(self, media: dict) -> list:
        images = media.get("image") or []
        if not images:
            return []
        return dict(self.image_processor(images, return_tensors="pt"))["image_grid_thw"]

    def _video_grid(self, media: dict):
        import torch

        videos = media.get("video") or []
        grids = [video_grid(video, self.video_processor, self.settings) for video in videos]
        return torch.tensor(grids, dtype=torch.long).reshape(-1, 3)

    def process_messages(self, messages: list[dict], media: dict) -> list[dict]:
        expanded = expand_placeholders(messages, self._grid(media), self.image_processor.merge_size)
        if media.get("video"):
            expanded = expand_videos(expanded, self._video_grid(media), self.image_processor.merge_size)
        return expanded

    def cut_reason(self, input_ids: list[int], media: dict) -> str | None:
        grid = self._grid(media)
        merge_length = self.image_processor.merge_size**2
        if media.get("video"):  # images and videos: every vision token of the row must be left
            videos = self._video_grid(media)
            counts = {
                IMAGE_TOKEN: sum(int(item.prod()) // merge_length for item in grid),
                VIDEO_TOKEN: sum(int(item.prod()) // merge_length for item in videos),
                VISION_END: len(grid) + sum(self._video_runs(item) for item in videos),
            }
            return count_cut_reason(input_ids, counts, self.tokenizer)
        if not len(grid):
            return None
        start, end, pad = self.tokenizer.convert_tokens_to_ids([VISION_START, VISION_END, IMAGE_TOKEN])
        counts = [int(item.prod()) // merge_length for item in grid]
        return media_cut_reason(input_ids, start, end, pad, counts)

    def _video_runs(self, grid) -> int:
        """`<|vision_start|>` ... `<|vision_end|>` runs of one video: one (Qwen3-VL: one per temporal patch)."""
        return 1

    def video_inputs(self, videos: list) -> dict:
        """pixel_values_videos and video_grid_thw of the regularized videos; second_per_grid_ts (temporal patch over
        the sampled fps) where the processor takes it (Qwen2.5-VL), as LLaMA-Factory adds it."""
        if not videos:
            return {}
        inputs = dict(self.video_processor(videos=[video.frames for video in videos], return_tensors="pt"))
        if "second_per_grid_ts" in (getattr(self.processor, "model_input_names", None) or ()):
            temporal = getattr(self.image_processor, "temporal_patch_size", 2)
            inputs["second_per_grid_ts"] = [temporal / video.fps for video in videos]
        return inputs

    def batch_inputs(self, media_rows: list[dict], batch: dict, model, row_ids=None) -> dict:

        images = [image for row in media_rows for image in row.get("image") or []]
        videos = [video for row in media_rows for video in row.get("video") or []]
        inputs = dict(self.image_processor(images, return_tensors="pt")) if images else {}
        inputs.update(self.video_inputs(videos))
        self._check_tokens(batch["input_ids"], inputs.get("image_grid_thw"), IMAGE_TOKEN, "image")
        self._check_tokens(batch["input_ids"], inputs.get("video_grid_thw"), VIDEO_TOKEN, "video")
        if model is None:  # generation: generate() computes the positions (LLaMA-Factory's collator has no model)
            return inputs
        return {**inputs, **self.mrope_inputs(model, batch, inputs, IMAGE_TOKEN, VIDEO_TOKEN)}

    def mrope_inputs(self, model, batch: dict, inputs: dict, image_token: str, video_token: str | None = None) -> dict:
        """position_ids (the text positions first, then mrope's three rows, as transformers reads them since issue
        39400) and rope_deltas from the model's get_rope_index; packed rows (they carry position_ids): each example's
        positions alone, no rope_deltas (LLaMA-Factory's neat packing)."""
        import torch

        if "position_ids" in batch:
            image, video = (
                -1 if token is None else self.tokenizer.convert_tokens_to_ids(token)
                for token in (image_token, video_token)
            )
            queues = self.token_queues(inputs, {image: "image_grid_thw", video: "video_grid_thw"})
            seconds = inputs.get("second_per_grid_ts")

            def rope(ids, spans):
                image_grid, video_grid = (
                    sliced(inputs.get(key), spans[token])
                    for token, key in ((image, "image_grid_thw"), (video, "video_grid_thw"))
                )
                return rope_positions(
                    model, ids, torch.ones_like(ids), image_grid, video_grid, sliced(seconds, spans[video])
                )[0]

            positions = packed_rope_positions(batch["input_ids"], batch["position_ids"], queues, rope)
            return {"position_ids": torch.cat([positions[:1], positions], dim=0)}
        positions, rope_deltas = rope_positions(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            inputs.get("image_grid_thw"),
            inputs.get("video_grid_thw"),
            inputs.get("second_per_grid_ts"),
        )
        return {"position_ids": torch.cat([positions[:1], positions], dim=0), "rope_deltas": rope_deltas}

    def token_queues(self, inputs: dict, grids: dict) -> dict:
        """token id -> the vision tokens of each image / video of the batch (grids: token id -> its grid's key)."""
        merge_length, queues = self.image_processor.merge_size**2, {}
        for token, key in grids.items():
            grid = inputs.get(key)
            queues[token] = [] if grid is None else [int(item.prod()) // merge_length for item in grid]
        return queues

    def _check_tokens(self, input_ids, grid, token: str = IMAGE_TOKEN, kind: str = "image") -> None:
        """The rows' media tokens must be the media's (a file changed since the rows were tokenized and cached, or
        a row cut by hand, otherwise fails deep inside the model)."""
        expected = (
            0 if grid is None else int(sum(int(item.prod()) for item in grid)) // self.image_processor.merge_size**2
        )
        found = int((input_ids == self.tokenizer.convert_tokens_to_ids(token)).sum())
        article = "an" if kind == "image" else "a"
        if found != expected:
            raise ValueError(
                f"a batch holds {found} {kind} tokens but its {kind}s make {expected}: {article} {kind} file changed since the "
                "data was tokenized (set overwrite_cache: true), or the rows were not made by this processor"
            )

    def stand_in(self) -> dict:
        from PIL import Image

        return {"image": [prepare_image(Image.new("RGB", STAND_IN_SIZE, STAND_IN_COLOR), *self._budget())]}

    def _budget(self) -> tuple[int, int]:
        return self.settings.image_max_pixels, self.settings.image_min_pixels
