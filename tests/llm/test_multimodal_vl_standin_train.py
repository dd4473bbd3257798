"""Kimi-VL and Youtu-VL stand-in models (their own remote code, tests/llm/golden/vl_remote_code.py, loaded with
trust_remote_code) trained three sft steps by `lathe train` and by LLaMA-Factory 0.9.5's run_exp
(make_llamafactory_vl_standin_train.py): full (Kimi-VL's vision tower and projector frozen by LLaMA-Factory's
defaults; Youtu-VL whole) and LoRA (rank 4, all: Youtu-VL's vision layers too). Losses 1e-5, grad norms 1e-4
relative, trainable / total counts exactly. Youtu-VL's model returns no loss: the loss is the shifted cross-entropy
LLaMA-Factory patches in, and its attention is eager (LLaMA-Factory forces it)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("transformers")

HERE = Path(__file__).parent


def _generator():
    path = HERE / "golden" / "make_llamafactory_vl_standin_train.py"
    spec = importlib.util.spec_from_file_location("make_vl_standin_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
GOLDEN = json.loads(GEN.GOLDEN.read_text())


@pytest.mark.parametrize("case", list(GEN.CASES))
def test_lathe_train_three_steps_equal_llamafactory(case, tmp_path):
    from lathe.llm.config.train import DataArguments, parse_train_config
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.workflows.stages import run_train
    from tests.goldens import assert_close_to_golden

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    from tests.llm.train_counts import ParameterCount

    family, keys = GEN.CASES[case]
    expected = GOLDEN[case]
    model, data = GEN.write_folders(tmp_path, family, fix_tokenizer)
    count = ParameterCount()
    run_train(parse_train_config(GEN.train_config(family, model, data, tmp_path / "out", **keys)), callbacks=[count])
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert count.counts == (expected["trainable"], expected["total"])
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert_close_to_golden(losses, expected["loss"], f"{case} losses", rel=0, abs=1e-5)
    norms = [entry["grad_norm"] for entry in history if "loss" in entry]
    assert_close_to_golden(norms, expected["grad_norm"], f"{case} norms", rel=1e-4)
    if case == "kimi_vl_full":  # LLaMA-Factory trains (and saves) Kimi-VL with greedy expert selection
        saved = json.loads((tmp_path / "out" / "config.json").read_text())
        assert saved["text_config"]["topk_method"] == "greedy"


def test_youtu_vl_attention_is_eager_with_auto_or_sdpa():
    from lathe.llm.model.remote_families import eager_attention

    assert eager_attention("auto", "youtu_vl") and eager_attention("sdpa", "youtu")
    assert not eager_attention("fa2", "youtu_vl") and not eager_attention("auto", "kimi_vl")
