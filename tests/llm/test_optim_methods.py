"""LLaMA-Factory's optimizer and loss keys (GaLore, APOLLO, BAdam, Adam-mini, Muon, DFT, EAFT, ASFT) train the
same numbers in `lathe train` as in LLaMA-Factory 0.9.5: every step's loss, grad_norm and learning rate, and
the saved weights; a prediction-only config (its nlg_eval example: an adapter, do_predict, no do_train) writes
the same generated_predictions.jsonl and BLEU-4 / ROUGE scores. Against tests/llm/golden/llamafactory_optim.json
(made by make_llamafactory_optim.py with LLaMA-Factory installed beside)."""

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from lathe.llm.commands import run_train
from lathe.llm.config.train import parse_train_config
from lathe.train.callbacks.events import TrainerCallback
from tests.goldens import GOLDEN_REL, assert_close_to_golden
from tests.llm.golden.make_llamafactory_optim import (
    CASES,
    GOLDEN,
    PREDICT_CASES,
    TOKENIZER,
    build_assets,
    case_config,
    encoded_pairs,
)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")]

GOLDENS = json.loads(GOLDEN.read_text(encoding="utf-8"))
# Muon orthogonalises each update with Newton-Schulz iterations in bfloat16 (8-bit mantissa): a last-bit change
# of a gradient on another CPU can flip a bfloat16 rounding, so its numbers move more than float32 rounding
# (measured: grad norms 5.2e-5 relative, losses 9e-6; docs/GOLDENS.md).
WIDER = {"muon": {"rel": 2e-4}}
PACKAGES = {
    "use_galore": "galore_torch",
    "use_apollo": "apollo_torch",
    "use_badam": "badam",
    "use_adam_mini": "adam_mini",
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets(tmp_path_factory.mktemp("methods"))


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.getbasetemp() / "home"))


class Recorder(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.steps.append({key: logs[key] for key in ("loss", "grad_norm", "learning_rate") if key in logs})


def _train(name, assets, output_dir, **extra):
    for key, package in PACKAGES.items():
        if CASES[name].get(key):
            pytest.importorskip(package)
    recorder = Recorder()
    config = parse_train_config({**case_config(name, *assets, str(output_dir)), **extra})
    run_train(config, callbacks=[recorder])
    return recorder.steps


def _assert_weights_equal_golden(folder: Path, golden: dict, what: str, rel: float = GOLDEN_REL) -> None:
    """Each saved tensor's sum and sum of squares (the golden's fingerprint) within the golden tolerance. A sum of
    elements of both signs cancels, so its absolute tolerance is `rel` times the sum of |w|: how far it may move
    when each element moves by `rel` (docs/GOLDENS.md has what was measured)."""
    tensors = {name: t.double() for name, t in load_file(str(folder / "model.safetensors")).items()}
    assert golden.keys() <= tensors.keys(), f"{what}: tensors {sorted(tensors)}"
    for name, (total, squares) in golden.items():
        tensor = tensors[name]
        assert_close_to_golden(float(tensor.square().sum()), squares, f"{what} sums of squares, {name}", rel=rel)
        margin = rel * float(tensor.abs().sum())
        assert_close_to_golden(float(tensor.sum()), total, f"{what} weight sums, {name}", rel=0, abs=margin)


@pytest.mark.parametrize("name", list(CASES))
def test_step_losses_equal_llamafactory(name, assets, tmp_path):
    golden = GOLDENS["cases"][name]
    assert golden["config"] == CASES[name], f"{name}: the golden file is stale; rerun make_llamafactory_optim.py"
    # LLaMA-Factory computes the full logits: with that path (chunked_cross_entropy: no) the losses are its bits
    # on the machine that recorded them, and within the golden tolerance on another CPU (tests/goldens.py).
    steps = _train(name, assets, tmp_path / "out", chunked_cross_entropy="no")
    wider = WIDER.get(name, {})
    losses = [s["loss"] for s in steps]
    assert_close_to_golden(losses, [s["loss"] for s in golden["steps"]], f"{name} losses", **wider)
    assert [s["learning_rate"] for s in steps] == [s["learning_rate"] for s in golden["steps"]]  # Python floats
    norms = [s["grad_norm"] for s in steps]
    assert_close_to_golden(norms, [s["grad_norm"] for s in golden["steps"]], f"{name} norms", **wider)
    assert set(golden["weights"]) == set(load_file(str(tmp_path / "out" / "model.safetensors")))
    _assert_weights_equal_golden(tmp_path / "out", golden["weights"], name, **wider)


@pytest.mark.parametrize("name", list(PREDICT_CASES))
def test_prediction_only_equals_llamafactory(name, assets, tmp_path):
    pytest.importorskip("jieba")
    golden = GOLDENS["cases"][name]
    assert golden["config"] == PREDICT_CASES[name], f"{name}: the golden file is stale"
    output = tmp_path / "out"
    config = parse_train_config(case_config(name, *assets, str(output)))
    assert not config.training.do_train  # do_predict without do_train predicts only
    metrics = run_train(config)
    lines = [
        json.loads(line) for line in (output / "generated_predictions.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert lines == golden["predictions"]
    saved = json.loads((output / "predict_results.json").read_text(encoding="utf-8"))
    for key, value in golden["metrics"].items():
        assert metrics[key] == value and saved[key] == value, key
    assert not any(path.name.startswith("checkpoint") or path.name == "model.safetensors" for path in output.iterdir())


def test_bleu_and_rouge_equal_llamafactory():
    pytest.importorskip("jieba")
    from transformers import AutoTokenizer

    from lathe.llm.workflows.metrics import GenerationMetrics
    from lathe.train.evaluation.outputs import EvalPrediction

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    tokenizer.pad_token = tokenizer.eos_token
    predictions, labels = encoded_pairs(tokenizer)
    scores = GenerationMetrics(tokenizer)(EvalPrediction(predictions=np.array(predictions), label_ids=np.array(labels)))
    golden = GOLDENS["cases"]["similarity"]["scores"]
    assert {key: scores[key] for key in golden} == golden
    assert scores["exact_match"] == 16.6667  # lathe's own addition: 1 of 6 equal


@pytest.mark.parametrize("name", ["baseline", "galore", "badam_layer", "muon"])
def test_the_default_chunked_loss_stays_within_rounding_of_llamafactory(name, assets, tmp_path):
    """lathe.llm's default loss (chunked: the logits never whole) sums in another order: the same steps within
    1e-5 (measured: about 1e-6)."""
    golden = GOLDENS["cases"][name]
    steps = _train(name, assets, tmp_path / "out")
    tolerance = WIDER.get(name, {"rel": 0, "abs": 1e-5})
    assert_close_to_golden([s["loss"] for s in steps], [s["loss"] for s in golden["steps"]], name, **tolerance)


class StopAfter(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


@pytest.mark.parametrize("name", ["badam_layer", "galore_layerwise"])
def test_interrupted_run_resumes_to_llamafactorys_weights(name, assets, tmp_path):
    """Stopped after step 3 (a checkpoint there), resumed: the weights of the uninterrupted run. For BAdam the
    checkpoint records the active block (BAdam's own state does not: it would restart at the first block)."""
    output = tmp_path / "out"
    for key, package in PACKAGES.items():
        if CASES[name].get(key):
            pytest.importorskip(package)
    values = {**case_config(name, *assets, str(output)), "save_strategy": "steps", "save_steps": 3}
    values["chunked_cross_entropy"] = "no"  # bit for bit against LLaMA-Factory's full-logits loss
    run_train(parse_train_config(values), callbacks=[StopAfter(3)])
    recorder = Recorder()
    run_train(
        parse_train_config({**values, "resume_from_checkpoint": str(output / "checkpoint-3")}), callbacks=[recorder]
    )
    golden = GOLDENS["cases"][name]
    assert_close_to_golden([s["loss"] for s in recorder.steps], [s["loss"] for s in golden["steps"][3:]], name)
    _assert_weights_equal_golden(output, golden["weights"], name)
