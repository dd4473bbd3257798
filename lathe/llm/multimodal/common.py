"""What the families beside Qwen2-VL share, as LLaMA-Factory 0.9.5's BasePlugin and MultiModalDataCollatorForSeq2Seq
do it: the media settings, the image processor and audio feature extractor calls, and the sft collator.

A family module (llava.py, gemma3.py, ...) gives:
- IMAGE_TOKEN / AUDIO_TOKEN: the template's media token (None for a kind the family does not take);
- COMPOSITES: model_type -> composite(...): the towers' parameter-name parts;
- media_tokens(processor): the tokens of an expanded medium, which cutoff_len must leave whole (media_cut_reason);
- process_messages(messages, images, audios, processor, settings): `<image>` / `<audio>` expanded;
- prefix_ids(images, tokenizer, processor): token ids put before the encoded conversation ([] but PaliGemma's);
- media_inputs(images, audios, counts, batch_ids, processor, settings): the collator's media tensors, with
  per-row `token_type_ids` lists (padded here) where the family has them.
`processor` is the model's transformers processor (AutoProcessor), read for the same attributes LLaMA-Factory
reads; `settings` is a MediaSettings from the config's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lathe.llm.multimodal.images import (
    AUDIO_PLACEHOLDER,
    DEFAULT_IMAGE_MAX_PIXELS,
    DEFAULT_IMAGE_MIN_PIXELS,
    IMAGE_PLACEHOLDER,
    fit_pixels,
)
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.data.padding import get_padding_side, pad_rows

FAKE_IMAGE_SIZE, FAKE_IMAGE_COLOR, FAKE_AUDIO_SAMPLES = (64, 64), (255, 255, 255), 1600
PAN_AND_SCAN = {  # LLaMA-Factory's fixed pan-and-scan settings for Gemma 3 (image_do_pan_and_scan: true)
    "do_pan_and_scan": True,
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}


@dataclass(frozen=True)
class MediaSettings:
    """The config keys the families read (LLaMA-Factory's defaults)."""

    image_max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS
    image_min_pixels: int = DEFAULT_IMAGE_MIN_PIXELS
    image_do_pan_and_scan: bool = False
    crop_to_patches: bool = False
    audio_sampling_rate: int = 16000


def composite(
    vision: tuple[str, ...] = ("vision_tower",),
    projector: tuple[str, ...] = ("multi_modal_projector",),
    language: tuple[str, ...] = ("language_model", "lm_head"),
    lora_conflict: tuple[str, ...] = (),
) -> dict[str, tuple[str, ...]]:
    """Parameter-name parts of a composite model, matched as substrings (LLaMA-Factory's COMPOSITE_MODELS entry,
    same defaults): what freeze_vision_tower / freeze_multi_modal_projector / freeze_language_model freeze, and
    what LoRA never wraps unless asked."""
    return {
        "vision_keys": vision,
        "projector_keys": projector,
        "language_keys": language,
        "lora_conflict_keys": lora_conflict,
    }


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


def waveform(audio, sampling_rate: int):
    """A mono waveform at `sampling_rate` from a row's audio: an array, or {"array", "sampling_rate"} as datasets
    decodes audio. Files are read by the data pipeline; a rate that differs is an error, never resampled silently."""
    import numpy as np

    if isinstance(audio, Mapping) and "array" in audio:
        rate = audio.get("sampling_rate", sampling_rate)
        if rate != sampling_rate:
            raise ValueError(f"audio at {rate} Hz; audio_sampling_rate is {sampling_rate}: resample it first")
        audio = audio["array"]
    if not isinstance(audio, np.ndarray):
        raise ValueError(f"expected an audio waveform (numpy array), got {type(audio).__name__}")
    return audio.mean(axis=0) if audio.ndim > 1 else audio


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


class FamilyCollator:
    """Pads rows with `text_collator` (lathe's SFTDataCollator), then adds the family's media tensors, as
    LLaMA-Factory's MultiModalDataCollatorForSeq2Seq does for unpacked rows. Rows carry "images" / "audios".

    A batch without images (for a family that takes images) or without audio (for one that takes audio) gets
    LLaMA-Factory's stand-in (a white 64x64 image, 1600 samples of silence) whose tokens are appended to the
    first row (prepended with left padding) with attention_mask 0 and labels -100: every batch runs the media
    tower (distributed runs otherwise hang waiting for its gradients) and the trained numbers do not move."""

    def __init__(self, text_collator, processor, family, settings: MediaSettings | None = None):
        self.text_collator = text_collator
        self.tokenizer = text_collator.tokenizer
        self.processor = processor
        self.family = family
        self.settings = settings or MediaSettings()

    def _stand_in(self, kind: str) -> tuple[list[int], Any]:
        if kind == "image":
            from PIL import Image

            medium, images, audios, placeholder = (
                Image.new("RGB", FAKE_IMAGE_SIZE, FAKE_IMAGE_COLOR),
                1,
                0,
                IMAGE_PLACEHOLDER,
            )
        else:
            import numpy as np

            medium, images, audios, placeholder = np.zeros(FAKE_AUDIO_SAMPLES), 0, 1, AUDIO_PLACEHOLDER
        media = [medium]
        text = self.family.process_messages(
            [{"role": "user", "content": placeholder}],
            media[:images],
            media[:audios],
            self.processor,
            self.settings,
        )[0]["content"]
        ids = self.family.prefix_ids(media[:images], self.tokenizer, self.processor)
        return ids + self.tokenizer.encode(text, add_special_tokens=False), medium

    def __call__(self, features: list[Mapping[str, Any]]) -> dict[str, Any]:
        import torch

        features = [dict(feature) for feature in features]
        images, audios, counts = [], [], {"image": [], "audio": []}
        for feature in features:
            row_images, row_audios = feature.pop("images", None) or [], feature.pop("audios", None) or []
            if feature.pop("videos", None):
                raise ValueError(
                    f"the {self.family.__name__.rsplit('.', 1)[-1]} family: video input is not supported yet"
                )
            images += row_images
            audios += row_audios
            counts["image"].append(len(row_images))
            counts["audio"].append(len(row_audios))
        name = self.family.__name__.rsplit(".", 1)[-1]
        for kind, media, token in (
            ("image", images, self.family.IMAGE_TOKEN),
            ("audio", audios, self.family.AUDIO_TOKEN),
        ):
            if media and token is None:  # LLaMA-Factory refuses them too: never dropped silently
                raise ValueError(f"the {name} family takes no {kind} input; use the template of a model that does")
        stand_in = []
        for kind, media, token in (
            ("image", images, self.family.IMAGE_TOKEN),
            ("audio", audios, self.family.AUDIO_TOKEN),
        ):
            if token is not None and not media:
                ids, medium = self._stand_in(kind)
                stand_in += ids
                media.append(medium)
                counts[kind][0] = 1
        if stand_in:
            first, right = features[0], get_padding_side(self.tokenizer) == "right"
            for key, value in (
                ("input_ids", stand_in),
                ("attention_mask", [0] * len(stand_in)),
                ("labels", [IGNORE_INDEX] * len(stand_in)),
            ):
                if key in first:
                    first[key] = list(first[key]) + value if right else value + list(first[key])
        batch_ids = [list(feature["input_ids"]) for feature in features]
        mm_inputs = self.family.media_inputs(images, audios, counts, batch_ids, self.processor, self.settings)
        token_types = mm_inputs.pop("token_type_ids", None)
        batch = self.text_collator(features)
        if "attention_mask" not in batch:  # rows stay apart by attention_mask; flattened packing has none
            raise ValueError("media rows need an attention_mask: packing is not supported for media yet")
        side, length = get_padding_side(self.tokenizer), batch["input_ids"].shape[-1]
        if "attention_mask" in features[0]:  # the rows' own masks (the stand-in's tokens are 0), padded likewise
            batch["attention_mask"] = pad_rows([feature["attention_mask"] for feature in features], 0, length, side)
        if token_types is not None:
            batch["token_type_ids"] = pad_rows(token_types, 0, length, side)
        cross = mm_inputs.pop("cross_attention_mask", None)
        if cross is not None:  # LLaMA-Factory pads it at the end whatever the padding side
            mm_inputs["cross_attention_mask"] = torch.nn.functional.pad(cross, (0, 0, 0, 0, 0, length - cross.shape[1]))
        batch.update(mm_inputs)
        return batch
