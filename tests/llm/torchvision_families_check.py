"""lathe against LLaMA-Factory on the families whose processors need torchvision
(tests/llm/golden/llamafactory_torchvision_families.safetensors, made by make_llamafactory_torchvision_families.py),
run by tests/llm/test_multimodal_torchvision_families.py in one subprocess with the torchvision test recipe:
video_check.check's comparison of the rows, batches and losses, and video_check.train's `lathe train` of its cases."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

from tests.llm.video_check import HERE, _module, check, train

GEN = _module("make_torchvision_families", HERE / "golden" / "make_llamafactory_torchvision_families.py")
MEDIA_TOKENS = {  # each family's vision tokens (the last of a row's media runs is one of them)
    "llama4": ["<|patch|>", "<|image_end|>"],
    "lfm2_vl": ["<image>"],
    "glm4v": ["<|image|>", "<|end_of_image|>", "<|end_of_video|>"],
    "pixtral": ["[IMG]", "[IMG_BREAK]", "[IMG_END]"],
    "intern_vl": ["<img>", "<IMG_CONTEXT>", "</img>"],
}


def run(folder: str, root: str) -> None:
    """Prints {"check": ..., "train": ...}: each part's result or the traceback that stopped it."""
    _, metadata = _golden_metadata()
    models = [model for model in GEN.MODELS if f"{model}.error" not in metadata]  # where LLaMA-Factory encodes
    parts = {
        "check": lambda: check(Path(folder), models, gen=GEN, media_tokens=MEDIA_TOKENS),
        "train": lambda: train(str(Path(root) / "train"), gen=GEN),
    }
    out = {}
    for part, function in parts.items():
        try:
            out[part] = function()
        except Exception:  # noqa: BLE001 (reported to the test that reads this part)
            out[part] = {"error": traceback.format_exc()}
    print(json.dumps(out))


def _golden_metadata():
    from tests.llm.video_check import golden

    return golden(GEN.GOLDEN)
