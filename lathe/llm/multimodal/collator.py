"""The sft collator for Qwen2-VL family rows: the text collator's padding, then the images' tensors and the
3-D rotary positions, as LLaMA-Factory 0.9.5's MultiModalDataCollatorForSeq2Seq returns them (unpacked rows).

A batch without any image gets LLaMA-Factory's stand-in: a white 64x64 image whose vision tokens are appended
to the first row (prepended with left padding) with attention_mask 0 and labels -100, so every batch runs
the vision tower (distributed runs otherwise hang waiting for its gradients) and no number moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lathe.llm.multimodal import qwen2_vl
from lathe.llm.multimodal.images import DEFAULT_IMAGE_MAX_PIXELS, DEFAULT_IMAGE_MIN_PIXELS, IMAGE_PLACEHOLDER
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.data.padding import get_padding_side, pad_rows

FAKE_IMAGE_SIZE, FAKE_IMAGE_COLOR = (64, 64), (255, 255, 255)


class Qwen2VLCollator:
    """Pads rows with `text_collator` (lathe's SFTDataCollator), then adds pixel_values, image_grid_thw,
    position_ids (4, batch, length: the text positions, then mrope's temporal, height and width rows, as
    transformers reads them since issue 39400) and rope_deltas. Rows carry their images under "images"."""

    def __init__(
        self,
        text_collator,
        image_processor,
        model,
        max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS,
        min_pixels: int = DEFAULT_IMAGE_MIN_PIXELS,
    ):
        self.text_collator = text_collator
        self.tokenizer = text_collator.tokenizer
        self.image_processor = image_processor
        self.model = model
        self.max_pixels, self.min_pixels = max_pixels, min_pixels

    def _fake_image(self, features: list[dict]) -> list:
        from PIL import Image

        image = Image.new("RGB", FAKE_IMAGE_SIZE, FAKE_IMAGE_COLOR)
        grid = qwen2_vl.image_inputs([image], self.image_processor, self.max_pixels, self.min_pixels)["image_grid_thw"]
        text = qwen2_vl.expand_placeholders(
            [{"role": "user", "content": IMAGE_PLACEHOLDER}], grid, self.image_processor.merge_size
        )[0]["content"]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        first = features[0]
        right = get_padding_side(self.tokenizer) == "right"
        for key, value in (
            ("input_ids", ids),
            ("attention_mask", [0] * len(ids)),
            ("labels", [IGNORE_INDEX] * len(ids)),
        ):
            if key in first:
                first[key] = list(first[key]) + value if right else value + list(first[key])
        return [image]

    def __call__(self, features: list[Mapping[str, Any]]) -> dict[str, Any]:
        import torch

        features = [dict(feature) for feature in features]
        images = [image for feature in features for image in (feature.pop("images", None) or [])]
        for feature in features:
            feature.pop("videos", None), feature.pop("audios", None)
        if not images:
            images = self._fake_image(features)
        batch = self.text_collator(features)
        if "attention_mask" in batch and "attention_mask" in features[0]:
            # the rows' own masks (the stand-in image's tokens are 0), padded as the text collator padded
            batch["attention_mask"] = pad_rows(
                [feature["attention_mask"] for feature in features],
                0,
                batch["input_ids"].shape[-1],
                get_padding_side(self.tokenizer),
            )
        if "attention_mask" not in batch:  # rows stay apart by attention_mask; flattened packing has none
            raise ValueError("Qwen2-VL rows need an attention_mask: packing is not supported for images yet")
        mm_inputs = qwen2_vl.image_inputs(images, self.image_processor, self.max_pixels, self.min_pixels)
        positions, rope_deltas = qwen2_vl.rope_positions(
            self.model, batch["input_ids"], batch["attention_mask"], mm_inputs.get("image_grid_thw")
        )
        batch["position_ids"] = torch.cat([positions[:1], positions], dim=0)
        batch["rope_deltas"] = rope_deltas
        batch.update(mm_inputs)
        return batch
