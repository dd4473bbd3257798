"""rollout_engine "lathe" (lathe/llm/rl/rollouts.py): greedy completions are `generate`'s exactly (rows ending at
different steps, repetition penalty on); one row sampled from a seed draws `generate`'s tokens under temperature,
top-k, top-p and min-p (the same scores, the same draws); a greedy GRPO run through it logs what the run through
`generate` logs; generation_kwargs it does not read are refused by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import grpo_cases  # noqa: E402
from test_grpo_golden import run_lathe_case  # noqa: E402

from tests.goldens import assert_close_to_golden  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rollouts_model")
    grpo_cases.build_model(folder)
    return str(folder)


@pytest.fixture(scope="module")
def policy(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lathe.llm.rl import generation

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer, generation.eos_ids_of(model, tokenizer)


def config_of(tokenizer, eos, **settings):
    from types import SimpleNamespace

    from lathe.llm.rl import generation

    values = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0}
    values.update(max_completion_length=12, generation_kwargs=settings.pop("generation_kwargs", None), **settings)
    return generation.generation_config(SimpleNamespace(**values), tokenizer, eos)


def test_greedy_is_generates_and_a_seeded_row_draws_generates_tokens(policy):
    from lathe.llm.rl import generation
    from lathe.llm.rl.rollouts import sample_dropping_finished

    torch.set_num_threads(1)
    model, tokenizer, eos = policy
    prompts = [tokenizer(p)["input_ids"] for p in grpo_cases.PROMPTS] * 3
    greedy = config_of(tokenizer, eos, repetition_penalty=1.3, generation_kwargs={"do_sample": False})
    expected = generation.sample(model, prompts, greedy, tokenizer.pad_token_id, eos, "cpu")
    got = sample_dropping_finished(model, prompts, greedy, tokenizer.pad_token_id, eos, "cpu")
    assert got == expected and len({len(c) for c in got}) > 2  # rows left the batch at different steps
    sampled = config_of(tokenizer, eos, temperature=0.9, top_k=30, top_p=0.95, min_p=0.02, repetition_penalty=1.1)
    for index, prompt in enumerate(prompts[:6]):
        torch.manual_seed(index)
        theirs = generation.sample(model, [prompt], sampled, tokenizer.pad_token_id, eos, "cpu")
        torch.manual_seed(index)
        assert sample_dropping_finished(model, [prompt], sampled, tokenizer.pad_token_id, eos, "cpu") == theirs


def test_a_greedy_grpo_run_through_lathes_engine_logs_what_generate_gives(model_dir, tmp_path):
    from lathe.llm.rl import GRPOConfig

    settings = {"max_steps": 1, "generation_kwargs": {"do_sample": False}, "repetition_penalty": 1.2}
    runs = [
        run_lathe_case("dapo_beta", model_dir, str(tmp_path / engine), rollout_engine=engine, **settings)
        for engine in ("generate", "lathe")
    ]
    assert runs[0]["generations"][0]["completion_ids"] == runs[1]["generations"][0]["completion_ids"]
    timings = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
    for step, (theirs, mine) in enumerate(zip(*(run["logs"] for run in runs)), start=1):
        theirs = {k: v for k, v in theirs.items() if k not in timings}
        assert_close_to_golden({k: mine[k] for k in theirs}, theirs, f"greedy lathe engine, step {step}", rel=1e-6)
    with pytest.raises(ValueError, match="generation_kwargs typical_p are not read by rollout_engine 'lathe'"):
        GRPOConfig(output_dir=str(tmp_path), rollout_engine="lathe", generation_kwargs={"typical_p": 0.9})
