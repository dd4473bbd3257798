"""The GLM-4.1V / GLM-4.5V family (glm4v, glm4_5v, glm_ocr templates) as LLaMA-Factory 0.9.5's GLM4VPlugin encodes
images: Qwen2-VL's image preparation (pixel budget, 28-pixel sides, 200:1) and grid, but each `<image>` becomes
`<|begin_of_image|>` + `<|image|>` x (t*h*w / merge_size^2) + `<|end_of_image|>`; the collator adds pixel_values,
image_grid_thw and the model's 3-D rotary positions (its get_rope_index, image tokens marked in mm_token_type_ids).

Videos are refused with one line: LLaMA-Factory 0.9.5's GLM4VPlugin (one `<|begin_of_image|>` run per frame, each
followed by its timestamp from Glm4vVideoProcessor) fails on every video row with transformers 5 (it calls the video
processor with images=None and metadata keyed `total_frames`; transformers 5's processor returns no timestamps), so
there is no LLaMA-Factory behaviour to match (docs/MULTIMODAL_FAMILIES.md, "GLM-4.1V and ERNIE-4.5-VL videos")."""

from __future__ import annotations

from dataclasses import dataclass

from lathe.llm.multimodal.base import Composite
from lathe.llm.multimodal.common import media_cut_reason, media_token_counts
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER
from lathe.llm.multimodal.qwen2_vl import LANGUAGE_MODEL_KEYS, LORA_CONFLICT_KEYS, Qwen2VLPlugin

BEGIN_IMAGE, END_IMAGE, IMAGE_TOKEN = "<|begin_of_image|>", "<|end_of_image|>", "<|image|>"
GLM4V = Composite(("visual.patch_embed", "visual.blocks"), ("visual.merger",), LANGUAGE_MODEL_KEYS, LORA_CONFLICT_KEYS)


def image_tokens(grid, merge_size: int) -> str:
    """One image's run: begin, `<|image|>` per merged patch, end."""
    return f"{BEGIN_IMAGE}{IMAGE_TOKEN * (int(grid.prod()) // merge_size**2)}{END_IMAGE}"


@dataclass
class Glm4vPlugin(Qwen2VLPlugin):
    """LLaMA-Factory's GLM4VPlugin for images (GLM-4.1V, GLM-4.5V, GLM-OCR)."""

    name = "glm4v"
    kinds = ("image",)
    missing = {
        "video": "GLM-4.1V's per-frame video runs with timestamps are not implemented in lathe (images are); "
        "LLaMA-Factory 0.9.5 fails on them too with transformers 5 (TypeError: its video processor call passes "
        "images=None and VideoMetadata total_frames)"
    }
    composites = {"glm4v": GLM4V, "glm4v_moe": GLM4V, "glm_ocr": GLM4V}

    def process_messages(self, messages: list[dict], media: dict) -> list[dict]:
        grid, used, expanded = self._grid(media), 0, []
        merge_size = self.image_processor.merge_size
        for message in messages:
            parts = message["content"].split(IMAGE_PLACEHOLDER)
            content = parts[0]
            for part in parts[1:]:
                if used >= len(grid):
                    raise ValueError(f"more {IMAGE_PLACEHOLDER} placeholders than images ({len(grid)})")
                content += image_tokens(grid[used], merge_size) + part
                used += 1
            expanded.append({**message, "content": content})
        return expanded

    def cut_reason(self, input_ids: list[int], media: dict) -> str | None:
        grid = self._grid(media)
        if not len(grid):
            return None
        text = "".join(image_tokens(item, self.image_processor.merge_size) for item in grid)
        counts = media_token_counts([{"content": text}], (BEGIN_IMAGE, IMAGE_TOKEN, END_IMAGE))
        return media_cut_reason(input_ids, counts, self.tokenizer)

    def batch_inputs(self, media_rows: list[dict], batch: dict, model, row_ids=None) -> dict:
        """pixel_values and image_grid_thw of the batch's images; position_ids (text row, then mrope's three) and
        rope_deltas from the model's get_rope_index, as LLaMA-Factory's collator computes them."""

        images = [image for row in media_rows for image in row.get("image") or []]
        inputs = dict(self.image_processor(images, return_tensors="pt")) if images else {}
        self._check_tokens(batch["input_ids"], inputs.get("image_grid_thw"), IMAGE_TOKEN, "image")
        return {**inputs, **self.mrope_inputs(model, batch, inputs, IMAGE_TOKEN)}
