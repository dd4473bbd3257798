"""GRPO pieces users rely on besides the TRL numbers (test_grpo_golden.py): `module:function` reward
functions resolved from the config's folder, clear errors for missing ones and for a reward function that
raises (its name and the dataset row), TRL's config rules, the repeated-prompt order and advantages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import grpo_cases  # noqa: E402

from lathe.llm.rl import GRPOConfig, GRPOTrainer  # noqa: E402
from lathe.llm.rl.losses import advantages_of  # noqa: E402
from lathe.llm.rl.rewards import RewardFunctionError, resolve_reward_function  # noqa: E402
from lathe.llm.rl.sampler import RepeatedPromptSampler  # noqa: E402


def test_module_function_resolved_from_the_config_folder_first(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_a.py").write_text("def exact(completions, **kw):\n    return [1.0 for _ in completions]\n")
    function = resolve_reward_function("my_rewards_a:exact", [str(tmp_path)])
    assert function(prompts=["p"], completions=["c"], completion_ids=[[1]]) == [1.0]


def test_missing_module_or_function_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"no module 'nowhere_rewards' in .*or on sys.path"):
        resolve_reward_function("nowhere_rewards:f", [str(tmp_path)])
    (tmp_path / "my_rewards_b.py").write_text("def other(**kw):\n    return []\n")
    with pytest.raises(ValueError, match=r"has no function 'missing'"):
        resolve_reward_function("my_rewards_b:missing", [str(tmp_path)])
    with pytest.raises(ValueError, match="neither a folder nor 'module:function'"):
        resolve_reward_function("just_a_name", [str(tmp_path)])


def test_config_rules_are_trls(tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=3,
        num_generations=4,
        bf16=False,
    )
    assert (args.steps_per_generation, args.generation_batch_size) == (3, 12)
    assert (args.loss_type, args.beta, args.learning_rate, args.scale_rewards) == ("dapo", 0.0, 1e-6, "group")
    with pytest.raises(ValueError, match="divisible by num_generations"):
        GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=6, num_generations=4, bf16=False)
    with pytest.raises(ValueError, match="at least 2"):
        GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=1, bf16=False)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        GRPOConfig(
            output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, loss_type="ppo", bf16=False
        )
    assert (
        GRPOConfig(output_dir=str(tmp_path), num_generations=8, scale_rewards=False, bf16=False).scale_rewards == "none"
    )


def test_sampler_repeats_each_prompt_per_generation_and_iteration():
    sampler = RepeatedPromptSampler(5, mini_repeat_count=2, batch_size=2, repeat_count=2, shuffle=False)
    assert list(sampler) == [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3]  # the 5th prompt fills no batch
    assert len(sampler) == 16


def test_advantages_are_group_normalised_and_unscored_completions_get_zero():
    rewards = torch.tensor([[1.0], [0.0], [float("nan")], [2.0]])
    advantages, _, _ = advantages_of(rewards, torch.ones(1), 2, "group")
    expected = (torch.tensor([1.0, 0.0]) - 0.5) / (torch.tensor([1.0, 0.0]).std() + 1e-4)
    assert torch.allclose(advantages[:2], expected)
    assert advantages[2:].tolist() == [0.0, 0.0]  # NaN row: no signal; its group mean is the other row's


def test_a_reward_function_that_raises_names_itself_and_the_row(tmp_path):
    model_dir = tmp_path / "model"
    grpo_cases.build_model(model_dir)

    def picky(completions, target, **kwargs):
        if 7 in target:
            raise KeyError("no answer key")
        return [0.0] * len(completions)

    args = GRPOConfig(output_dir=str(tmp_path / "out"), **{**grpo_cases.BASE, "max_steps": 3, "shuffle_dataset": False})
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=picky, args=args, train_dataset=grpo_cases.dataset())
    with pytest.raises(
        RewardFunctionError, match=r"reward function 'picky' raised KeyError.*dataset row 5.*'write a word:'"
    ):
        trainer.train()


def test_a_reward_model_folder_scores_prompt_and_completion(tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    model_dir = tmp_path / "model"
    grpo_cases.build_model(model_dir)
    scorer_dir = tmp_path / "my_scorer"
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=2,
    )
    LlamaForSequenceClassification(config).save_pretrained(str(scorer_dir))
    tokenizer.save_pretrained(str(scorer_dir))
    args = GRPOConfig(output_dir=str(tmp_path / "out"), **{**grpo_cases.BASE, "max_steps": 1})
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=[str(scorer_dir)], args=args, train_dataset=grpo_cases.dataset()
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["reward"] == logged["rewards/my_scorer/mean"]
    assert logged["rewards/my_scorer/std"] > 0  # the model's scores differ between completions
