"""The LLM quickstart as a user runs it: `lathe train examples/quickstart.yaml` from the repository
root trains the tiny Llama from scratch on string reversal and must reach a held-out exact match far
above chance; the same model with its random starting weights must not. Also: the committed assets
are what examples/quickstart/make_assets.py writes."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "examples/quickstart.yaml"  # relative, as in the README: its paths are relative to ROOT
ASSETS = ROOT / "examples" / "quickstart"
# Measured 100.0 (500 of 500) on 2 CPU cores, identical over runs (seeded, CPU). The margin is for
# other CPUs' float rounding, not for a model that did not learn: chance is ~0.
MIN_EXACT_MATCH = 90.0
TEST_EXAMPLES = 500


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    # The tokenization cache lives under ~/.cache/lathe: keep it private to this module's runs.
    return tmp_path_factory.mktemp("home")


def _predictions(output):
    return [json.loads(line) for line in (output / "generated_predictions.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_quickstart_learns_to_reverse_strings(tmp_path, home):
    output = tmp_path / "quickstart"
    # The machine's own thread count (OMP_NUM_THREADS left as is): the README's timing is for 2 cores.
    env = {**os.environ, "HOME": str(home)}
    result = subprocess.run(
        [sys.executable, "-m", "lathe", "train", CONFIG, f"output_dir={output}", "disable_tqdm=true"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]

    exact_match = json.loads((output / "predict_results.json").read_text())["predict_exact_match"]
    assert exact_match >= MIN_EXACT_MATCH, result.stdout[-2000:]
    # The last line a user sees is the score.
    assert (
        result.stdout.strip()
        .splitlines()[-1]
        .startswith(f"Exact match: {exact_match:.1f}% of {TEST_EXAMPLES} held-out")
    )

    predictions = _predictions(output)
    assert len(predictions) == TEST_EXAMPLES
    # LLaMA-Factory's format: the prompt as the template renders it (chatml markers included), answers unstripped.
    for line in predictions:  # the references are the prompts reversed, so the score means what it says
        prompt = line["prompt"].split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        assert line["label"].strip() == prompt[::-1]
    matches = sum(line["predict"].strip() == line["label"].strip() for line in predictions)
    assert 100 * matches / TEST_EXAMPLES == pytest.approx(exact_match)

    files = {path.name for path in output.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "generation_config.json",
        "trainer_log.jsonl",
        "train_results.json",
        "lathe_train_config.yaml",
    } <= files, sorted(files)
    assert not any(name.startswith("checkpoint-") for name in files)  # save_strategy: "no"
    assert not (ASSETS / "model" / "model.safetensors").exists()  # trained from scratch, nothing written back


@pytest.mark.slow
def test_untrained_model_scores_near_zero(tmp_path, home, monkeypatch):
    """The negative control: the same config without training (the seeded random weights it starts
    from) generates from the same prompts and is scored the same way."""
    from lathe.llm.commands import run_train
    from lathe.llm.config.train import parse_train_config

    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(ROOT)
    config = parse_train_config(CONFIG, [f"output_dir={tmp_path / 'untrained'}", "do_train=false", "disable_tqdm=true"])
    metrics = run_train(config)
    assert metrics["predict_exact_match"] <= 1.0
    assert len(_predictions(tmp_path / "untrained")) == TEST_EXAMPLES


def test_assets_are_what_make_assets_writes(tmp_path):
    from transformers import AutoTokenizer

    spec = importlib.util.spec_from_file_location("make_assets", ASSETS / "make_assets.py")
    make_assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_assets)
    make_assets.write_assets(tmp_path / "model", tmp_path / "data")
    regenerate = "rerun python examples/quickstart/make_assets.py"

    assert sorted(path.name for path in (tmp_path / "data").iterdir()) == sorted(
        path.name for path in (ASSETS / "data").iterdir()
    )
    for path in (tmp_path / "data").iterdir():
        assert path.read_bytes() == (ASSETS / "data" / path.name).read_bytes(), (
            f"data/{path.name} differs: {regenerate}"
        )

    configs = [json.loads((folder / "config.json").read_text()) for folder in (tmp_path / "model", ASSETS / "model")]
    for config in configs:
        config.pop("transformers_version")
    assert configs[0] == configs[1], f"model/config.json differs: {regenerate}"
    assert not (ASSETS / "model" / "model.safetensors").exists()  # no weights: the quickstart trains from scratch
    # The tokenizer by what it does (its files' layout depends on the tokenizers/transformers versions).
    fresh, committed = (AutoTokenizer.from_pretrained(str(folder)) for folder in (tmp_path / "model", ASSETS / "model"))
    sample = "<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\ndlrow ,olleH<|im_end|>\n"
    assert committed.get_vocab() == fresh.get_vocab(), regenerate
    assert committed.all_special_tokens == fresh.all_special_tokens, regenerate
    assert committed.encode(sample, add_special_tokens=False) == fresh.encode(sample, add_special_tokens=False), (
        regenerate
    )
    assert committed.decode(committed.encode(sample, add_special_tokens=False)) == sample  # lossless, character level
