"""The processor stand-ins of the multimodal packing golden's Llama 4 and LFM2-VL rows
(make_llamafactory_mm_packing.py --families; tests/llm/test_multimodal_packing.py). Their real image processors need
torchvision, which the packing comparison does not start (it runs in the test process); the real processors are
compared against LLaMA-Factory in make_llamafactory_torchvision_families.py. These are deterministic image processors
with the outputs and attributes the plugins read (LFM2-VL's spatial_shapes and downsample_factor; Llama 4's tiles,
aspect_ratios, patch_size, downsample_ratio and transformers' own Llama4Processor._prompt_split_image): the packing
golden holds LLaMA-Factory's packed rows and tensors made with exactly these, so they stay as they were recorded.
The interface is the stand-in generator's: FAMILIES, ROWS, make_image, messages_of, settings_of, make_tokenizer,
make_processor."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = {"llama4": ("llama4", "image"), "lfm2_vl": ("lfm2_vl", "image")}
TOKENS = {
    "llama4": ["<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>", "<|tile_x_separator|>"]
    + ["<|tile_y_separator|>"],
    "lfm2_vl": ["<image>"],
}
TILE, PATCH = 28, 14


def _families_generator():
    spec = importlib.util.spec_from_file_location("make_families", HERE / "make_llamafactory_families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = _families_generator()
make_image, messages_of, CUTOFF_LEN, ROWS = BASE.make_image, BASE.messages_of, BASE.CUTOFF_LEN, BASE.ROWS


def _pixels(image, width: int, height: int):
    """The image resized to width x height, as a float tensor (3, height, width) in [0, 1]."""
    import numpy as np
    import torch

    array = np.asarray(image.convert("RGB").resize((width, height)), dtype="float32") / 255.0
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


class Llama4StandInImageProcessor:
    """Llama 4's image processor's outputs: up to 2x2 tiles of 28x28 pixels per image (plus a 28x28 global tile for
    a tiled image) in pixel_values (tiles, 3, 28, 28), and aspect_ratios (tile rows, tile columns) per image."""

    def __call__(self, images, return_tensors="pt", **kwargs):
        import torch

        tiles, ratios = [], []
        for image in images:
            rows, columns = min(2, math.ceil(image.height / TILE)), min(2, math.ceil(image.width / TILE))
            pixels = _pixels(image, columns * TILE, rows * TILE)
            tiles += [
                pixels[:, r * TILE : (r + 1) * TILE, c * TILE : (c + 1) * TILE]
                for r in range(rows)
                for c in range(columns)
            ]
            if rows * columns > 1:
                tiles.append(_pixels(image, TILE, TILE))
            ratios.append([rows, columns])
        return {"pixel_values": torch.stack(tiles), "aspect_ratios": torch.tensor(ratios)}


class Lfm2VlStandInImageProcessor:
    """LFM2-VL's image processor's outputs: 16-pixel patches, (rows, columns) per image in spatial_shapes (even, for
    the 2x downsample), pixel_values (images, most patches, 3 * 16 * 16) padded with zeros and pixel_attention_mask."""

    downsample_factor = 2

    def __call__(self, images, return_tensors="pt", **kwargs):
        import torch

        rows, shapes = [], []
        for image in images:
            height, width = 2 * math.ceil(image.height / 32), 2 * math.ceil(image.width / 32)
            pixels = _pixels(image, width * 16, height * 16)
            rows.append(pixels.reshape(3, height, 16, width, 16).permute(1, 3, 0, 2, 4).reshape(height * width, -1))
            shapes.append([height, width])
        most = max(len(row) for row in rows)
        values = torch.zeros(len(rows), most, rows[0].shape[1])
        mask = torch.zeros(len(rows), most, dtype=torch.long)
        for index, row in enumerate(rows):
            values[index, : len(row)], mask[index, : len(row)] = row, 1
        return {"pixel_values": values, "spatial_shapes": torch.tensor(shapes), "pixel_attention_mask": mask}


class Llama4StandInProcessor:
    """Llama4Processor's attributes the plugins read (patch_size, downsample_ratio for pixel_shuffle_ratio 0.5) and
    its own _prompt_split_image, beside the stand-in image processor."""

    patch_size, downsample_ratio = PATCH, 4

    def __init__(self, tokenizer):
        self.image_processor, self.tokenizer = Llama4StandInImageProcessor(), tokenizer

    def _prompt_split_image(self, aspect_ratio, num_patches_per_chunk):
        from transformers import Llama4Processor

        return Llama4Processor._prompt_split_image(self, aspect_ratio, num_patches_per_chunk)


def settings_of(family: str) -> dict:
    return {"image_max_pixels": BASE.IMAGE_MAX_PIXELS, "image_min_pixels": BASE.IMAGE_MIN_PIXELS}


def make_tokenizer(family: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BASE.TOKENIZER))
    tokenizer.add_special_tokens({"additional_special_tokens": TOKENS[family]})
    return tokenizer


def make_processor(family: str, tokenizer):
    from types import SimpleNamespace

    if family == "lfm2_vl":
        return SimpleNamespace(image_processor=Lfm2VlStandInImageProcessor(), tokenizer=tokenizer)
    return Llama4StandInProcessor(tokenizer)
