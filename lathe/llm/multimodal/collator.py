"""The collator for multimodal rows of any family: the text collator's padding, then the family plugin's tensors
(pixel_values, grids, mrope position ids, ...), as LLaMA-Factory 0.9.5's MultiModalDataCollatorForSeq2Seq returns
them (unpacked rows). Rows carry their media under "images" / "videos" / "audios" (paths or opened items).

A batch without a kind of media the family takes gets the family's stand-in of that kind (LLaMA-Factory's white
64x64 image, 1600 samples of silence): its tokens are appended to the first row (prepended with left padding) with
attention_mask 0 and labels -100, so every batch runs each media tower (distributed runs otherwise hang waiting for
its gradients) and no number moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lathe.llm.multimodal.base import KINDS, PLACEHOLDERS, MediaSettings
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.data.padding import get_padding_side, pad_rows

COLUMNS = {"image": "images", "video": "videos", "audio": "audios"}


class MultimodalCollator:
    """`text_collator` (lathe's SFTDataCollator, or a preference collator) pads the text; `plugin` adds the rest.

    Packed rows (they carry position_ids, 0 where each example starts) keep the text collator's block-diagonal 4-D
    mask: the flattened one-row form has no mask to hold the stand-in apart, and the vision tower's own attention
    must not see packed boundaries. `generating`: rows to generate from (predict_with_generate); the model's
    generate() computes its positions itself, as LLaMA-Factory's collator leaves them to it there (model=None).
    `compute_dtype` (a torch dtype name): every floating tensor of the batch is cast to it, as LLaMA-Factory's sft
    collator casts them (its preference collators do not)."""

    def __init__(self, text_collator, plugin, model, generating: bool = False, compute_dtype: str | None = None):
        self.compute_dtype = compute_dtype
        self.text_collator = text_collator
        self.tokenizer = getattr(text_collator, "tokenizer", None) or plugin.tokenizer
        self.plugin = plugin
        self.model = model
        self.generating = generating
        if getattr(text_collator, "packed_attention", None) == "auto":
            text_collator.packed_attention = "mask"

    def media_of(self, feature: dict) -> dict[str, list]:
        media = {}
        for kind in KINDS:
            items = feature.pop(COLUMNS[kind], None) or []
            if items:
                self.plugin.check_kinds({kind: len(items)}, "a training batch")
                media[kind] = self.plugin.regularize(kind, list(items), "a training batch")
        return media

    def stand_in_ids(self, media: dict[str, list]) -> list[int]:
        ids = []
        for kind, items in media.items():
            messages = [{"role": "user", "content": PLACEHOLDERS[kind] * len(items)}]
            content = self.plugin.process_messages(messages, {kind: items})[0]["content"]
            encoded = self.tokenizer.encode(content, add_special_tokens=False)
            ids += self.plugin.process_token_ids(encoded, None, {kind: items})[0]
        return ids

    def add_stand_in(self, features: list[dict], media_rows: list[dict]) -> None:
        # LLaMA-Factory's rule: the image stand-in goes to a batch with neither images nor videos
        covers = {"image": ("image", "video")}
        stand_in = {
            kind: items
            for kind, items in (self.plugin.stand_in() or {}).items()
            if not any(row.get(other) for row in media_rows for other in covers.get(kind, (kind,)))
        }
        if not stand_in:
            return
        ids = self.stand_in_ids(stand_in)
        first, right = features[0], get_padding_side(self.tokenizer) == "right"
        for key, value in (
            ("input_ids", ids),
            ("attention_mask", [0] * len(ids)),
            ("labels", [IGNORE_INDEX] * len(ids)),
            ("position_ids", list(range(len(ids)))),  # packed rows: the stand-in is an example of its own
        ):
            if key in first:
                first[key] = list(first[key]) + value if right else value + list(first[key])
        media_rows[0] = {**media_rows[0], **stand_in}

    def __call__(self, features: list[Mapping[str, Any]]) -> dict[str, Any]:
        features = [dict(feature) for feature in features]
        packed = "position_ids" in features[0]
        if packed:
            self.plugin.check_packing("packed rows with media")
        media_rows = [self.media_of(feature) for feature in features]
        self.add_stand_in(features, media_rows)
        row_ids = [list(feature["input_ids"]) for feature in features]
        batch = self.text_collator(features)
        if "attention_mask" in batch and "attention_mask" in features[0] and not packed:
            # the rows' own masks (the stand-in's tokens are 0), padded as the text collator padded
            batch["attention_mask"] = pad_rows(
                [feature["attention_mask"] for feature in features],
                0,
                batch["input_ids"].shape[-1],
                get_padding_side(self.tokenizer),
            )
        if "attention_mask" not in batch:  # rows stay apart by attention_mask; flattened packing has none
            raise ValueError(
                "multimodal rows need an attention_mask: the flattened one-row form of packed rows has none"
            )
        model = None if self.generating and not packed else self.model  # packed rows are training rows
        batch.update(self.plugin.batch_inputs(media_rows, batch, model, row_ids))
        batch = self.plugin.finish_batch(batch)  # a family's last word (MiniCPM-V nests it in `data`)
        # as LLaMA-Factory's sft collator: the batch's top-level floating tensors in the compute dtype
        if self.compute_dtype is not None:
            import torch

            dtype = getattr(torch, self.compute_dtype)
            for key, value in batch.items():
                # the media tensors; a packed 4-D attention_mask stays as the text collator built it for the model
                # (LLaMA-Factory builds its own in the compute dtype: cast, it is the same tensor)
                if key != "attention_mask" and isinstance(value, torch.Tensor) and value.is_floating_point():
                    batch[key] = value.to(dtype)
        return batch


def Qwen2VLCollator(text_collator, image_processor, model, max_pixels=None, min_pixels=None):  # noqa: N802
    """The Qwen2-VL family's collator from an image processor and a pixel budget (rows carry "images")."""
    from lathe.llm.multimodal.qwen2_vl import Qwen2VLPlugin

    settings = MediaSettings()
    if max_pixels is not None:
        settings.image_max_pixels = max_pixels
    if min_pixels is not None:
        settings.image_min_pixels = min_pixels
    return MultimodalCollator(text_collator, Qwen2VLPlugin(image_processor, text_collator.tokenizer, settings), model)
