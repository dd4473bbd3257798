"""The ERNIE-4.5-VL family (ernie_vl template) as LLaMA-Factory 0.9.5's ErnieVLPlugin encodes images: each image fitted
into the pixel budget only (BasePlugin's preparation, no 28-pixel sides), its grid from the model's image processor,
and the k-th `<image>` of a row becoming `Picture k:<|IMAGE_START|>` + `<|IMAGE_PLACEHOLDER|>` x (t*h*w /
merge_size^2) + `<|IMAGE_END|>`. The collator adds pixel_values, image_grid_thw and the model's 3-D rotary positions
(its get_rope_index, image tokens marked in mm_token_type_ids), as LLaMA-Factory's collator does for any model with
get_rope_index. LLaMA-Factory registers no composite model for it: no part is frozen (its freeze_* keys do nothing).

Videos are refused with one line: LLaMA-Factory 0.9.5's ErnieVLPlugin writes `Video k:<|VIDEO_START|>` + a placeholder
per t*h*w / merge_size^2 patches + `<|VIDEO_END|>`, twice what the model reads (it also merges frames in time:
temporal_merge_size), and fails in the collator's get_rope_index on every video row (after its images=None video
processor call, which transformers 5 refuses) (docs/MULTIMODAL_FAMILIES.md, "GLM-4.1V and ERNIE-4.5-VL videos")."""

from __future__ import annotations

from dataclasses import dataclass

from lathe.llm.multimodal.base import FamilyPlugin
from lathe.llm.multimodal.common import media_cut_reason, media_token_counts
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER, fit_pixels
from lathe.llm.multimodal.qwen2_vl import STAND_IN_COLOR, STAND_IN_SIZE, Qwen2VLPlugin

START, END, IMAGE_TOKEN = "<|IMAGE_START|>", "<|IMAGE_END|>", "<|IMAGE_PLACEHOLDER|>"


@dataclass
class ErnieVLPlugin(Qwen2VLPlugin):
    """LLaMA-Factory's ErnieVLPlugin for images (ERNIE-4.5-VL)."""

    name = "ernie_vl"
    kinds = ("image",)
    missing = {
        "video": "ERNIE-4.5-VL's video tokens are not implemented in lathe (images are); LLaMA-Factory 0.9.5 fails "
        "on them too (its video token count is twice what the model reads: the positions do not fit)"
    }
    composites = {}  # LLaMA-Factory registers none: the model trains whole
    whole_model_types = ("ernie4_5_vl_moe",)

    def regularize(self, kind: str, items: list, where: str = "") -> list:
        return FamilyPlugin.regularize(self, kind, items, where)  # the pixel budget only

    def process_messages(self, messages: list[dict], media: dict) -> list[dict]:
        grid, used, expanded = self._grid(media), 0, []
        merge_length = self.image_processor.merge_size**2
        for message in messages:
            parts = message["content"].split(IMAGE_PLACEHOLDER)
            content = parts[0]
            for part in parts[1:]:
                if used >= len(grid):
                    raise ValueError(f"more {IMAGE_PLACEHOLDER} placeholders than images ({len(grid)})")
                count = int(grid[used].prod()) // merge_length
                content += f"Picture {used + 1}:{START}{IMAGE_TOKEN * count}{END}" + part
                used += 1
            expanded.append({**message, "content": content})
        return expanded

    def cut_reason(self, input_ids: list[int], media: dict) -> str | None:
        images = media.get("image") or []
        if not images:
            return None
        expanded = self.process_messages([{"content": IMAGE_PLACEHOLDER * len(images)}], media)
        return media_cut_reason(input_ids, media_token_counts(expanded, (IMAGE_TOKEN, END)), self.tokenizer)

    def batch_inputs(self, media_rows: list[dict], batch: dict, model, row_ids=None) -> dict:

        images = [image for row in media_rows for image in row.get("image") or []]
        inputs = dict(self.image_processor(images, return_tensors="pt")) if images else {}
        self._check_tokens(batch["input_ids"], inputs.get("image_grid_thw"), IMAGE_TOKEN, "image")
        return {**inputs, **self.mrope_inputs(model, batch, inputs, IMAGE_TOKEN)}

    def stand_in(self) -> dict:
        from PIL import Image

        image = Image.new("RGB", STAND_IN_SIZE, STAND_IN_COLOR)
        return {"image": [fit_pixels(image, self.settings.image_max_pixels, self.settings.image_min_pixels)]}
