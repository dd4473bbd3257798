"""Gemma 3n (Gemma3nForConditionalGeneration: timm's MobileNetV5 vision tower, a conformer audio tower) against
LLaMA-Factory 0.9.5 (tests/llm/golden/llamafactory_gemma3n.json, made by make_llamafactory_gemma3n.py): the
image-and-audio row and the row without media (stand-ins), alone and as a pair: collated ids and labels exactly and
the tiny model's loss; and `lathe train`'s three steps (full with the frozen towers, LoRA on the attention projections)
against run_exp: losses 1e-5, grad norms 1e-4 relative, trainable and total counts exactly. Everything runs in one
subprocess with the torchvision test recipe and timm (tests/llm/torchvision_recipe.py)."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """gemma3n_check.run once for the tests below (one start of torch, transformers, torchvision and timm)."""
    pytest.importorskip("transformers")
    from tests.llm.torchvision_recipe import run_with_torchvision

    root = str(tmp_path_factory.mktemp("gemma3n"))
    code = f"from tests.llm.gemma3n_check import run; run({root!r})"
    return json.loads(run_with_torchvision(code, timm=True).stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def golden():
    return json.loads((Path(__file__).parent / "golden" / "llamafactory_gemma3n.json").read_text())


def test_batches_and_losses_equal_llamafactory(results, golden):
    from tests.goldens import assert_close_to_golden

    versions = golden["versions"]
    assert (versions["llamafactory"], versions["transformers"], versions["timm"]) == ("0.9.5", "5.6.0", "1.0.31")
    ours, expected = results["losses"], golden["losses"]
    assert "error" not in ours, ours.get("error")
    assert sorted(ours["batches"]) == sorted(expected["batches"]) == ["pair.0", "single.0", "single.1"]
    same_weights = abs(ours["weights"] - expected["weights"]) < 1e-6
    assert same_weights  # _same_weights: both transformers hold one model
    for name, batch in ours["batches"].items():
        reference = expected["batches"][name]
        # LLaMA-Factory's batch carries feature_attention_mask None (lathe's too): the keys are equal
        assert batch["keys"] == reference["keys"], name
        assert (batch["input_ids"], batch["labels"]) == (reference["input_ids"], reference["labels"]), name
        assert_close_to_golden(batch["loss"], reference["loss"], f"gemma3n {name} loss", rel=0, abs=1e-5)


def test_lathe_trains_as_llamafactory(results, golden):
    from tests.goldens import assert_close_to_golden

    ours, expected_runs = results["train"], golden["train"]
    assert "error" not in ours, ours.get("error")
    stopped = sorted(name for name, run in expected_runs.items() if "error" in run)
    assert stopped == ["gemma3n_lora"] and sorted(ours) == ["gemma3n_full", "gemma3n_lora_attention"]
    for name, run in ours.items():
        expected = expected_runs[name]
        assert (run["trainable"], run["total"]) == (expected["trainable"], expected["total"]), name
        assert_close_to_golden(run["loss"], expected["loss"], f"{name} losses", rel=0, abs=1e-5)
        assert_close_to_golden(run["grad_norm"], expected["grad_norm"], f"{name} norms", rel=1e-4)


def test_lora_target_all_is_refused_where_llamafactory_stops(results, golden):
    """`lora_target: all` stops in LLaMA-Factory 0.9.5 on peft's refusal of the decoder layer `layers.0` (the bare
    name "0" of altup_projections.0 matches it); lathe refuses in one line naming the layers and the way out."""
    assert "Target module Gemma3nTextDecoderLayer(" in golden["train"]["gemma3n_lora"]["error"]
    assert results["losses"]["lora_all"].startswith(
        "lora_target: all: Gemma3nForConditionalGeneration keeps linear layers in lists "
        "(model.language_model.altup_projections.0, model.language_model.altup_unembed_projections.0)"
    )
    assert "name the target modules instead (linear layers here: " in results["losses"]["lora_all"]
