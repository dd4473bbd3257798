"""tests/goldens.py, the comparison of fresh runs with recorded numbers: what it lets through and what it catches;
and the CI check that golden tests pass on kernels other than this CPU's (docs/GOLDENS.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.goldens import GOLDEN_ABS, GOLDEN_REL, assert_close_to_golden, assert_same_files, json_without_versions

REPOSITORY = Path(__file__).resolve().parents[1]


def test_floats_within_the_tolerance_pass_and_beyond_it_fail():
    loss = 6.015223503112793  # a step loss another CPU computed as 6.015223979949951 (1 ulp of float32 away)
    assert_close_to_golden([6.015223979949951, 2.0], [loss, 2.0], "losses")
    assert_close_to_golden(loss * (1 + 0.9 * GOLDEN_REL), loss, "loss")
    assert_close_to_golden(0.9 * GOLDEN_ABS, 0.0, "near zero")
    with pytest.raises(AssertionError, match=r"losses\[1\]: 2.0001, golden 2.0"):
        assert_close_to_golden([loss, 2.0001], [loss, 2.0], "losses")
    with pytest.raises(AssertionError, match="kl"):
        assert_close_to_golden({"kl": 2 * GOLDEN_ABS}, {"kl": 0.0}, "logs")
    assert_close_to_golden(1.5e-5, 1e-5, "wider", rel=0, abs=1e-5)  # a caller's own tolerance


def test_integers_strings_and_none_are_exact():
    assert_close_to_golden(
        {"ids": [1, 2, 3], "name": "x", "bias": None}, {"ids": [1, 2, 3], "name": "x", "bias": None}, "row"
    )
    for actual, golden in (
        ([1, 2, 4], [1, 2, 3]),
        ("y", "x"),
        (0.0, None),
        (True, 1),
        ({"a": 1}, {"b": 1}),
        ([1], [1, 2]),
    ):
        with pytest.raises(AssertionError):
            assert_close_to_golden(actual, golden, "exact")


def test_arrays_compare_whole_with_integer_dtypes_exact():
    features = torch.linspace(-1, 1.5, 3000)
    assert_close_to_golden({"input_features": features * (1 + 1e-7)}, {"input_features": features}, "audio")
    assert_close_to_golden(np.arange(5), np.arange(5), "numpy ids")
    with pytest.raises(AssertionError, match=r"audio\[7\]"):
        bumped = features.clone()
        bumped[7] += 1e-3
        assert_close_to_golden(bumped, features, "audio")
    with pytest.raises(AssertionError, match="golden 2"):
        assert_close_to_golden(torch.tensor([1, 3]), torch.tensor([1, 2]), "ids")
    with pytest.raises(AssertionError, match="dtype"):
        assert_close_to_golden(torch.ones(2), torch.ones(2, dtype=torch.long), "kind")
    with pytest.raises(AssertionError, match="shape"):
        assert_close_to_golden(torch.ones(2), torch.ones(3), "shape")
    nan = float("nan")
    assert_close_to_golden(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0]), "nan in both")
    with pytest.raises(AssertionError):
        assert_close_to_golden(torch.tensor([nan, 1.0]), torch.tensor([0.0, 1.0]), "nan in one")


def test_the_report_records_the_largest_differences(tmp_path, monkeypatch):
    monkeypatch.setenv("LATHE_GOLDEN_REPORT", str(tmp_path / "report.jsonl"))
    assert_close_to_golden([1.0, 2.0 + 2e-6], [1.0, 2.0], "losses")
    (entry,) = [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    assert entry["what"] == "losses" and entry["abs"] == pytest.approx(2e-6, rel=1e-6)
    assert entry["rel"] == pytest.approx(1e-6, rel=1e-6) and entry["used"] == pytest.approx(2e-6 / 5e-6, rel=1e-6)


def test_files_that_embed_a_library_version_compare_without_it(tmp_path):
    for folder, version in (("written", "5.23.0"), ("committed", "4.57.1")):
        (tmp_path / folder / "model").mkdir(parents=True)
        config = {"model_type": "llama", "hidden_size": 8, "transformers_version": version}
        (tmp_path / folder / "model" / "config.json").write_text(json.dumps(config, indent=1 if version < "5" else 2))
        (tmp_path / folder / "data.jsonl").write_text('{"a": 1}\n')
    assert json_without_versions(tmp_path / "written" / "model" / "config.json") == {
        "model_type": "llama",
        "hidden_size": 8,
    }
    assert_same_files(tmp_path / "written", tmp_path / "committed", "assets")
    (tmp_path / "written" / "data.jsonl").write_text('{"a": 2}\n')
    with pytest.raises(AssertionError, match="data.jsonl differs"):
        assert_same_files(tmp_path / "written", tmp_path / "committed", "assets")


# One test of each kind of golden: optimizer step losses, norms and weight checksums (AdamW), preference logs with
# full logits (KTO: log-prob sums and kl), audio features (Qwen2-Audio's log-mel input_features). Few, as each costs
# CPU seconds in every suite run (about 20 in all, in a subprocess).
ANOTHER_CPU = [
    "tests/llm/test_optim_methods.py::test_step_losses_equal_llamafactory[baseline]",
    "tests/llm/test_preference_golden.py::test_training_logs_with_full_logits_equal_llamafactory_bit_for_bit[kto_lora]",
    "tests/llm/test_multimodal_families.py::test_family_encodes_and_collates_as_llamafactory[qwen2_audio]",
]


@pytest.mark.slow
def test_golden_tests_pass_on_another_cpus_kernels(tmp_path):
    """The goldens were recorded on one CPU; a user's CPU picks other kernels. Rerun a golden test of each kind
    with PyTorch's portable kernels (ATEN_CPU_CAPABILITY=default, no AVX) and MKL's SSE4.2 code path: they pass."""
    env = dict(os.environ, PYTHONPATH=str(REPOSITORY), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.update(ATEN_CPU_CAPABILITY="default", MKL_ENABLE_INSTRUCTIONS="SSE4_2", ONEDNN_MAX_CPU_ISA="SSE41")
    env["LATHE_GOLDEN_REPORT"] = str(tmp_path / "report.jsonl")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", *ANOTHER_CPU]
    result = subprocess.run(command, cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    assert f"{len(ANOTHER_CPU)} passed" in result.stdout, result.stdout[-2000:]
    report = [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    assert len({entry["what"].split(",")[0] for entry in report}) >= 4  # the comparisons ran
