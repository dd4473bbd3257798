"""The image processor backend is chosen as LLaMA-Factory 0.9.5 chooses it (`AutoProcessor.from_pretrained(path,
use_fast=use_fast_tokenizer)`): transformers' torchvision backend where torchvision imports (here through the test
recipe, tests/llm/torchvision_recipe.py, in a subprocess), its PIL backend where it does not; lathe's pixel_values
are then the ones LLaMA-Factory's call computes, in both environments."""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

CHECK = """
import json, sys
from pathlib import Path
import torch
from transformers import AutoImageProcessor, AutoProcessor
from tests.llm import multimodal_cases as cases
from lathe.llm.multimodal.base import MediaSettings
from lathe.llm.multimodal.encode import MediaEncoder
from lathe.llm.templates import get_template_and_fix_tokenizer
from lathe.llm.config.train import DataArguments

folder = Path(sys.argv[1])
tokenizer = cases.generator().make_tokenizer()
template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="qwen2_vl"))
encoder = MediaEncoder(template, tokenizer, str(folder), MediaSettings(image_max_pixels=40 * 40, image_min_pixels=256))
plugin = encoder.plugin
images = plugin.regularize("image", [cases.generator().make_image("wide"), cases.generator().make_image("large")])
batch = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
ours = plugin.image_processor(images, return_tensors="pt")
try:  # LLaMA-Factory's call; without torchvision the video processor fails: the image processor alone
    reference = AutoProcessor.from_pretrained(str(folder), use_fast=True).image_processor
except ImportError:
    reference = AutoImageProcessor.from_pretrained(str(folder), use_fast=True)
theirs = reference(images, return_tensors="pt")
print(json.dumps({
    "backend": type(plugin.image_processor).__name__,
    "reference": type(reference).__name__,
    "equal": bool(torch.equal(ours["pixel_values"], theirs["pixel_values"])),
    "grid": ours["image_grid_thw"].tolist(),
    "pixels": ours["pixel_values"].flatten()[:4000].tolist(),
}))
"""


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    from tests.llm.multimodal_cases import make_model_folder

    return make_model_folder(tmp_path_factory.mktemp("qwen2vl"))


def _run(code: str, folder: Path, torchvision: bool) -> dict:
    """CHECK's printed result: with torchvision by the recipe's Python, without it in this process (the test skips
    where torchvision imports here)."""
    if torchvision:
        from tests.llm.torchvision_recipe import run_with_torchvision

        out = run_with_torchvision(f"import sys; sys.argv = ['x', {str(folder)!r}]\n" + code).stdout
    else:
        import contextlib
        import io
        import sys
        from unittest import mock

        printed = io.StringIO()
        with mock.patch.object(sys, "argv", ["x", str(folder)]), contextlib.redirect_stdout(printed):
            exec(compile(code, "<backend check>", "exec"), {"__name__": "__main__"})
        out = printed.getvalue()
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_backend_is_chosen_as_llamafactory_chooses_it(model_folder):
    pytest.importorskip("transformers")
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision imports here: the PIL side needs an environment without it")
    pil = _run(CHECK, model_folder, torchvision=False)
    assert pil["backend"] == pil["reference"] == "Qwen2VLImageProcessorPil" and pil["equal"]
    fast = _run(CHECK, model_folder, torchvision=True)
    assert fast["backend"] == fast["reference"] == "Qwen2VLImageProcessor" and fast["equal"]
    # the same patches and grids; the torchvision backend's resize rounds differently from PIL's
    assert fast["grid"] == pil["grid"]
    difference = max(abs(a - b) for a, b in zip(fast["pixels"], pil["pixels"]))
    assert 0 < difference < 0.5
