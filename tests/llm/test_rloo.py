"""lathe's RLOOTrainer against TRL 1.16's RLOOTrainer (goldens from bench/rloo_goldens.py): the same sampled tokens,
rewards and leave-one-out advantages at every generation and the same logged numbers at every step, for the KL
penalty in the reward (full and LoRA), several updates per generation with accumulation, normalised advantages and
the reward clip; and the GRPO keys RLOO does not read are refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import grpo_cases  # noqa: E402
from test_grpo_golden import run_lathe_case  # noqa: E402

GOLDEN = json.loads((HERE / "golden" / "trl_rloo.json").read_text())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rloo_model")
    grpo_cases.build_model(folder)
    return str(folder)


@pytest.mark.parametrize("case", sorted(GOLDEN["cases"]))
def test_rloo_matches_trl(case, model_dir, tmp_path):
    torch.set_num_threads(1)
    expected = GOLDEN["cases"][case]
    got = run_lathe_case(case, model_dir, str(tmp_path), grpo_cases.RLOO_CASES, trainer="rloo")
    # advantages abs 1e-5: with beta > 0 an advantage is a difference of O(1) rewards less summed KL terms (float32).
    grpo_cases.assert_matches_trl(case, got, expected, log_rel=1e-4, log_abs=1e-6, advantage_abs=1e-5)


def test_rloo_refuses_grpo_only_keys_and_bad_clip_range():
    from lathe.llm.rl import RLOOConfig

    with pytest.raises(ValueError, match="loss_type is a GRPO setting"):
        RLOOConfig(output_dir="unused", loss_type="grpo", use_cpu=True)
    with pytest.raises(ValueError, match="reward_clip_range"):
        RLOOConfig(output_dir="unused", reward_clip_range=(1.0, -1.0), use_cpu=True)
    assert RLOOConfig(output_dir="unused", use_cpu=True, per_device_train_batch_size=2).beta == 0.05
