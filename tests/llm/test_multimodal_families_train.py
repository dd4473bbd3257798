"""`lathe train` (sft, and dpo / kto for two) with the families beside Qwen2-VL against LLaMA-Factory 0.9.5's own run_exp
(tests/llm/golden/llamafactory_families_train.json, made by make_llamafactory_families_train.py): each family's tiny
random-weight model, processor and tokenizer (make_llamafactory_families.py) saved in a folder with its first two
golden rows (images as PNG, audio as 32-bit PCM WAV), three steps of one batch of both rows, full tuning with the
vision tower frozen (LLaMA-Factory's default), LoRA, the tower open, the projector alone, and LoRA dpo / kto on the rows
as pairs / kto rows: the same losses, grad norms and trainable-parameter counts."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

from tests.goldens import assert_close_to_golden  # noqa: E402
from tests.llm.test_multimodal_families import GEN, GOLDEN_DIR  # noqa: E402  (the golden generator, loaded once)

GOLDEN = json.loads((GOLDEN_DIR / "llamafactory_families_train.json").read_text())


def _train_generator():
    spec = importlib.util.spec_from_file_location(
        "make_families_train", GOLDEN_DIR / "make_llamafactory_families_train.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRAIN = _train_generator()


def _fix_tokenizer(tokenizer, template: str) -> None:
    from lathe.llm.config.train import DataArguments
    from lathe.llm.templates import get_template_and_fix_tokenizer

    get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))


def _folders(root: Path, family: str) -> tuple[Path, Path]:
    model, data, _ = GEN.write_folders(root, family, _fix_tokenizer)
    return model, data


@pytest.mark.parametrize("name", list(TRAIN.CASES))
def test_lathe_train_three_steps_equal_llamafactory(name, tmp_path):
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.stages import run_train

    family, keys = TRAIN.CASES[name]
    model, data = _folders(tmp_path, family)

    from tests.llm.train_counts import ParameterCount

    count = ParameterCount()
    run_train(
        parse_train_config(TRAIN.train_config(GEN, family, model, data, tmp_path / "out", **keys)), callbacks=[count]
    )
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    expected = GOLDEN[name]
    assert count.counts == (expected["trainable"], expected["total"])
    losses = [e["loss"] for e in history if "loss" in e]
    # wider than the golden tolerance (tests/goldens.py): the tolerances these multimodal runs always had
    assert_close_to_golden(losses, expected["loss"], f"{name} losses", rel=0, abs=1e-5)
    norms = [e["grad_norm"] for e in history if "loss" in e]
    assert_close_to_golden(norms, expected["grad_norm"], f"{name} norms", rel=1e-4)


def test_paligemma_image_prefix_counts_against_cutoff_len(tmp_path):
    """LLaMA-Factory counts the image prefix first: the encoded row, prefix included, is at most cutoff_len."""
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.setup import load_data

    model, data = _folders(tmp_path, "paligemma")
    keys = {"model_name_or_path": str(model), "stage": "sft", "do_train": True, "dataset": "rows"}
    keys.update(dataset_dir=str(data), template="paligemma", cutoff_len=16, output_dir=str(tmp_path / "out"))
    keys.update(max_dropped_rows_share=1.0)  # the cutoff cuts most trained tokens on purpose (the opt-out)
    tokenizer, _, datasets = load_data(parse_train_config({**keys, "use_cpu": True}), stage="sft")
    rows = datasets["train_dataset"]["input_ids"]
    image = tokenizer.convert_tokens_to_ids("<image>")
    assert [len(ids) for ids in rows] == [16, 16]
    assert [ids.count(image) for ids in rows] == [4, 8] and rows[1][:8] == [image] * 8  # 4 tokens per image


@pytest.mark.parametrize(
    "family, package",
    [
        ("pixtral", "torchvision"),
        ("intern_vl", "torchvision"),
        ("llava_next_video", "torchvision"),
        ("video_llava", "torchvision"),
        ("gemma3n", "timm"),
    ],
)
def test_a_family_whose_processor_needs_a_missing_package_names_it(family, package):
    from types import SimpleNamespace

    from lathe.llm.multimodal.encode import MediaEncoder

    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    template = SimpleNamespace(name=family, multimodal=family)
    encoder = MediaEncoder(template, None, "unused", processor=SimpleNamespace())
    with pytest.raises(ValueError, match=f"the {family} family needs {package} .*pip install {package}"):
        _ = encoder.plugin
