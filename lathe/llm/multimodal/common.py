"""What the families beside Qwen2-VL share, as LLaMA-Factory 0.9.5's BasePlugin does it: the image processor and
audio feature extractor calls, and ModulePlugin, the FamilyPlugin (base.py) over a family module of this shape.

A family module (llava.py, gemma3.py, ...) gives, and ends with a ModulePlugin subclass that names the family:
- IMAGE_TOKEN / AUDIO_TOKEN (and VIDEO_TOKEN where the family takes video): the template's media token (None for a
  kind the family does not take);
- COMPOSITES: model_type -> composite(...): the towers' parameter-name parts;
- media_tokens(processor): the tokens of an expanded medium, which cutoff_len must leave whole (media_cut_reason);
- process_messages(messages, images, audios, processor, settings): `<image>` / `<audio>` expanded;
- prefix_ids(images, tokenizer, processor): token ids put before the encoded conversation ([] but PaliGemma's);
- media_inputs(images, audios, counts, batch_ids, processor, settings): the collator's media tensors, with
  per-row `token_type_ids` lists (padded here) where the family has them.
A family with VIDEO_TOKEN gets its videos too (`videos=`: video.Video objects, frames sampled with PyAV and fitted into
video_min_pixels..video_max_pixels) in process_messages and media_inputs.
`processor` is the model's transformers processor (AutoProcessor), read for the same attributes LLaMA-Factory
reads; `settings` is the run's MediaSettings (base.py). Images reach these functions as opened (the pixel budget is
applied inside, once, from the original image, as LLaMA-Factory regularizes for each call).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import ClassVar

from lathe.llm.multimodal.audio import waveform
from lathe.llm.multimodal.base import PLACEHOLDERS, Composite, FamilyPlugin, MediaSettings
from lathe.llm.multimodal.images import check_placeholders, fit_pixels, open_image
from lathe.llm.multimodal.video import check_torchvision, read_video
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.data.padding import get_padding_side, pad_rows

__all__ = ["MediaSettings", "ModulePlugin"]

FAKE_IMAGE_SIZE, FAKE_IMAGE_COLOR, FAKE_AUDIO_SAMPLES = (64, 64), (255, 255, 255), 1600  # LLaMA-Factory's stand-ins
PAN_AND_SCAN = {  # LLaMA-Factory's fixed pan-and-scan settings for Gemma 3 (image_do_pan_and_scan: true)
    "do_pan_and_scan": True,
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}


def composite(
    vision: tuple[str, ...] = ("vision_tower",),
    projector: tuple[str, ...] = ("multi_modal_projector",),
    language: tuple[str, ...] = ("language_model", "lm_head"),
    lora_conflict: tuple[str, ...] = (),
) -> Composite:
    """Parameter-name parts of a composite model, matched as substrings (LLaMA-Factory's COMPOSITE_MODELS entry,
    same defaults): what freeze_vision_tower / freeze_multi_modal_projector / freeze_language_model freeze, and
    what LoRA never wraps unless asked."""
    return Composite(vision, projector, language, lora_conflict)


def fit_images(images: list, settings: MediaSettings) -> list:
    """Each image fitted into the pixel budget and made RGB (LLaMA-Factory's regularization for every family)."""
    return [fit_pixels(image, settings.image_max_pixels, settings.image_min_pixels) for image in images]


def image_processor_inputs(images: list, processor, settings: MediaSettings, counts: list[int] | None = None) -> dict:
    """The image processor's tensors for the images, each fitted into the pixel budget first; `counts` (images
    per row) nests them by row, as Llama 3.2 Vision's processor takes them. No images: {}."""
    if not images:
        return {}
    prepared = fit_images(images, settings)
    if counts is not None:
        nested, start = [], 0
        for count in counts:
            nested.append(prepared[start : start + count])
            start += count
        prepared = nested
    kwargs = dict(PAN_AND_SCAN) if settings.image_do_pan_and_scan else {}
    return dict(processor.image_processor(prepared, return_tensors="pt", **kwargs))


def audio_processor_inputs(audios: list, processor, settings: MediaSettings) -> dict:
    """The feature extractor's input_features for the waveforms (padded to its full window, as LLaMA-Factory
    asks) and their feature_attention_mask. No audio: {}."""
    if not audios:
        return {}
    extractor = getattr(processor, "feature_extractor", None) or getattr(processor, "audio_processor", None)
    if extractor is None:
        raise ValueError(f"{type(processor).__name__} has no feature extractor: audio needs the model's processor")
    inputs = dict(
        extractor(
            [waveform(audio, settings.audio_sampling_rate) for audio in audios],
            sampling_rate=settings.audio_sampling_rate,
            return_attention_mask=True,
            padding="max_length",
            return_tensors="pt",
        )
    )
    inputs["feature_attention_mask"] = inputs.pop("attention_mask", None)
    return inputs


def video_processor_of(processor):
    """The processor's video processor (transformers builds video processors on torchvision): one line naming
    torchvision where it does not import, or naming the processor where it has none."""
    check_torchvision("a video row")
    video_processor = getattr(processor, "video_processor", None)
    if video_processor is None:
        raise ValueError(
            f"the model's processor ({type(processor).__name__}) has no video processor: load the model folder's "
            "processor with torchvision installed (processor_config.json / video_preprocessor_config.json)"
        )
    return video_processor


def placeholder_runs(messages: list[dict], placeholder: str, replacement) -> list[dict]:
    """The messages with the k-th `placeholder` (over all messages, in order) replaced by replacement(k)."""
    expanded, used = [], 0
    for message in messages:
        # split, never replace in place: a family's token may be the placeholder itself (LLaVA's `<image>`)
        parts = message["content"].split(placeholder)
        content = parts[0]
        for part in parts[1:]:
            content += replacement(used) + part
            used += 1
        expanded.append({**message, "content": content})
    return expanded


def media_token_counts(messages: list[dict], tokens: tuple[str, ...]) -> dict[str, int]:
    """How many of each of the family's media tokens the expanded messages hold (special tokens: one id each)."""
    return {token: sum(message["content"].count(token) for message in messages) for token in tokens}


def media_cut_reason(input_ids: list[int], counts: dict[str, int], tokenizer) -> str | None:
    """Why an encoded row cannot train after cutoff_len, or None: every media token the expanded messages held
    (`counts`) must still be there. LLaMA-Factory keeps a row cut through its media, and the model then stops
    on features that do not match their tokens (PaliGemma's image prefix is never cut: it is counted first)."""
    for token, count in counts.items():
        kept = input_ids.count(tokenizer.convert_tokens_to_ids(token))
        if kept < count:
            return f"cutoff_len cuts through the media: {kept} of its {count} {token} tokens are left"
    return None


class ModulePlugin(FamilyPlugin):
    """The FamilyPlugin over the family module that defines the subclass (its functions above), as LLaMA-Factory's
    plugin steps: the module's media kinds (IMAGE_TOKEN / AUDIO_TOKEN) and COMPOSITES are read at definition."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        module = sys.modules[cls.__module__]
        tokens = (("image", module.IMAGE_TOKEN), ("video", getattr(module, "VIDEO_TOKEN", None)))
        cls.kinds = tuple(kind for kind, token in (*tokens, ("audio", module.AUDIO_TOKEN)) if token is not None)
        cls.composites = module.COMPOSITES
        cls.whole_model_types = getattr(module, "WHOLE_MODEL_TYPES", ())

    requires: ClassVar[tuple[str, str] | None] = None  # (package, what needs it): checked when the run's plugin is made
    # Packed rows: media_inputs reads each packed row's ids as LLaMA-Factory's get_mm_inputs reads them (token types
    # by token, cross_attention_mask from the image tokens, pixels in row order), so the rows' tensors are its own.
    packs = True

    def check_settings(self) -> None:
        super().check_settings()
        if self.requires and importlib.util.find_spec(self.requires[0]) is None:
            package, needer = self.requires
            raise ValueError(
                f"the {self.name} family needs {package} ({needer} imports it): pip install {package} "
                "(built for your torch)"
            )

    @property
    def family(self):
        return sys.modules[type(self).__module__]

    def _args(self, media: dict) -> tuple[list, list]:
        return list(media.get("image") or []), list(media.get("audio") or [])

    def _videos(self, media_rows: list[dict]) -> dict:
        """{"videos": the rows' videos in order} for a family that takes video, else {} (its functions take none)."""
        if "video" not in self.kinds:
            return {}
        return {"videos": [video for row in media_rows for video in row.get("video") or []]}

    def regularize(self, kind: str, items: list, where: str = "") -> list:
        """Images opened (the family's calls fit them into the pixel budget), audio read as waveforms, videos' frames
        sampled and fitted into the video pixel budget (LLaMA-Factory's BasePlugin._regularize_videos)."""
        if kind == "image":
            return [open_image(item, None, where) for item in items]
        if kind == "video" and "video" in self.kinds:
            s, videos = self.settings, []
            for item in items:
                try:
                    video = read_video(item, s.video_fps, s.video_maxlen)
                except (OSError, ValueError) as error:
                    raise ValueError(f"{where}: {error}") from None
                video.frames = [fit_pixels(frame, s.video_max_pixels, s.video_min_pixels) for frame in video.frames]
                videos.append(video)
            return videos
        if kind == "audio":
            try:
                return [waveform(item, self.settings.audio_sampling_rate) for item in items]
            except (OSError, ValueError) as error:
                raise ValueError(f"{where}: {error}") from None
        return super().regularize(kind, items, where)

    def process_messages(self, messages: list[dict], media: dict) -> list[dict]:
        counts = {kind: len(items) for kind, items in media.items()}
        check_placeholders(messages, counts, "a row")
        videos = self._videos([media])
        return self.family.process_messages(messages, *self._args(media), self.processor, self.settings, **videos)

    def prefix_length(self, media: dict) -> int:
        return len(self.family.prefix_ids(self._args(media)[0], self.tokenizer, self.processor))

    def process_token_ids(self, input_ids: list[int], labels: list[int] | None, media: dict):
        prefix = self.family.prefix_ids(self._args(media)[0], self.tokenizer, self.processor)
        if not prefix:
            return input_ids, labels
        return prefix + list(input_ids), None if labels is None else [IGNORE_INDEX] * len(prefix) + list(labels)

    def cut_reason(self, input_ids: list[int], media: dict) -> str | None:
        placeholders = "".join(PLACEHOLDERS[kind] * len(media.get(kind) or []) for kind in PLACEHOLDERS)
        expanded = self.process_messages([{"role": "user", "content": placeholders}], media)
        counts = media_token_counts(expanded, self.family.media_tokens(self.processor))
        return media_cut_reason(input_ids, counts, self.tokenizer)

    def batch_inputs(self, media_rows: list[dict], batch: dict, model, row_ids: list[list[int]] | None = None) -> dict:
        """The module's media tensors; per-row token_type_ids padded as the text was, cross_attention_mask padded at
        the end whatever the padding side (as LLaMA-Factory pads it)."""
        import torch

        images = [item for row in media_rows for item in row.get("image") or []]
        audios = [item for row in media_rows for item in row.get("audio") or []]
        counts = {kind: [len(row.get(kind) or []) for row in media_rows] for kind in ("image", "video", "audio")}
        if row_ids is None:
            raise ValueError(f"the {self.name} family needs each row's unpadded input_ids (MultimodalCollator)")
        videos = self._videos(media_rows)
        inputs = self.family.media_inputs(images, audios, counts, row_ids, self.processor, self.settings, **videos)
        length, side = batch["input_ids"].shape[-1], get_padding_side(self.tokenizer)
        if inputs.get("token_type_ids") is not None:
            inputs["token_type_ids"] = pad_rows(inputs["token_type_ids"], 0, length, side)
        cross = inputs.get("cross_attention_mask")
        if cross is not None:
            inputs["cross_attention_mask"] = torch.nn.functional.pad(cross, (0, 0, 0, 0, 0, length - cross.shape[1]))
        return inputs

    def stand_in(self) -> dict:
        """LLaMA-Factory's fake media, one per kind the family takes: a white 64x64 image, 1600 samples of silence."""
        stand_in = {}
        if "image" in self.kinds:
            from PIL import Image

            stand_in["image"] = [Image.new("RGB", FAKE_IMAGE_SIZE, FAKE_IMAGE_COLOR)]
        if "audio" in self.kinds:
            import numpy as np

            stand_in["audio"] = [np.zeros(FAKE_AUDIO_SAMPLES)]
        return stand_in
