"""Regenerate LLaMA-Factory's encoding of Youtu-VL image rows (youtu_vl template) that
tests/llm/test_multimodal_youtu_vl.py compares lathe against.

    python tests/llm/golden/make_llamafactory_youtu_vl.py [--python bench/.venv-lf/bin/python]

Youtu-VL's processor is remote code in its model repository (not in transformers, nor reachable here): both sides
get a processor whose image processor is transformers' Qwen2VLImageProcessorPil (a NaViT-style patch processor, as
Youtu-VL's vision tower takes; real, deterministic), so what is compared is LLaMA-Factory's token and collator path
(one pad per image, the image processor's tensors passed through), not Youtu-VL's pixels. Runs
make_llamafactory_families.run_family in LLaMA-Factory 0.9.5's environment (`--worker`) with its rows (one image,
two images, one image in a two-turn chat, no image: the stand-in image), the committed BPE tokenizer plus Youtu-VL's
vision tokens, and Pillow 12.3 first on the path; writes tests/llm/golden/llamafactory_youtu_vl.safetensors (the
layout of llamafactory_families.safetensors).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_youtu_vl.safetensors"
VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|video_pad|>", "<|vision_end|>"]


def _families_generator():
    spec = importlib.util.spec_from_file_location("make_families", HERE / "make_llamafactory_families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = _families_generator()


def make_tokenizer(family: str = "youtu_vl"):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BASE.TOKENIZER))
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    return tokenizer


def make_processor(family: str = "youtu_vl", tokenizer=None):
    """An object with the image processor LLaMA-Factory's plugin reads (14-pixel patches, 2x2 merge)."""
    from types import SimpleNamespace

    from transformers import Qwen2VLImageProcessorPil

    return SimpleNamespace(image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 16))


def use_in(base) -> None:
    """The families generator (a loaded copy) made to run Youtu-VL: its table, tokenizer and processor."""
    base.FAMILIES = {"youtu_vl": ("youtu_vl", "image")}
    base.make_tokenizer, base.make_processor = make_tokenizer, make_processor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--pillow", default="bench/.cache/pillow12", help="a folder with Pillow 12.3 (lathe's)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import llamafactory
        import PIL
        import transformers
        from safetensors.torch import save_file

        use_in(BASE)
        tensors, metadata = {}, {}
        BASE.run_family("youtu_vl", tensors, metadata)
        versions = {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__}
        metadata["versions"] = json.dumps({**versions, "pillow": PIL.__version__})
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    paths = [os.path.abspath(args.pillow), args.stubs]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(path for path in paths if os.path.isdir(path)),
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
        OMP_NUM_THREADS="1",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
