"""The GRPO cases that bench/grpo_goldens.py runs under TRL and tests/llm/test_grpo_golden.py runs under
lathe: a tiny Llama with seeded weights over the committed BPE tokenizer, a prompt dataset with a
column the reward functions read, and two deterministic reward functions. Imports neither lathe nor TRL."""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER = Path(__file__).resolve().parent / "golden" / "tokenizers" / "bpe"

PROMPTS = ["count to five:", "say hello", "the cat sat on", "1 2 3", "abc", "write a word:"]
TARGETS = [5, 3, 4, 6, 2, 7]

BASE = {
    "per_device_train_batch_size": 8,
    "num_generations": 4,
    "max_completion_length": 8,
    "max_steps": 3,
    "learning_rate": 5e-2,
    "lr_scheduler_type": "constant",
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "seed": 42,
    "bf16": False,
    "gradient_checkpointing": False,
    "use_cpu": True,
}

CASES = {
    "dapo_beta0": {},
    "dapo_beta": {"beta": 0.1},
    "grpo_beta0": {"loss_type": "grpo"},
    "grpo_beta": {"loss_type": "grpo", "beta": 0.1},
    "bnpo": {"loss_type": "bnpo", "beta": 0.1},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "dapo_iter2": {"num_iterations": 2, "beta": 0.1},
    "grpo_iter2_ga2": {
        "loss_type": "grpo",
        "num_iterations": 2,
        "gradient_accumulation_steps": 2,
        "per_device_train_batch_size": 4,
    },
    "lora_beta": {"beta": 0.1, "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
    "lora_grpo_iter2": {
        "loss_type": "grpo",
        "num_iterations": 2,
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    },
    "mask_truncated": {"mask_truncated_completions": True, "loss_type": "bnpo"},
    "conversational": {"conversational": True, "beta": 0.1},
    "gspo": {"importance_sampling_level": "sequence", "loss_type": "grpo", "num_iterations": 2, "beta": 0.1},
    "gspo_dapo_beta0": {"importance_sampling_level": "sequence", "num_iterations": 2},
    "delta": {"delta": 1.05, "num_iterations": 2, "epsilon": 0.02, "beta": 0.1},
    "top_entropy": {"top_entropy_quantile": 0.2, "loss_type": "bnpo", "beta": 0.1},
    "cispo": {"loss_type": "cispo", "num_iterations": 2, "epsilon_high": 1.2, "beta": 0.1},
    "sapo": {"loss_type": "sapo", "num_iterations": 2, "sapo_temperature_neg": 1.5},
    "luspo": {"loss_type": "luspo", "importance_sampling_level": "sequence", "num_iterations": 2},
    "vespo": {"loss_type": "vespo", "num_iterations": 2, "vespo_k_neg": 2.5, "beta": 0.1},
    # A reward model (a sequence classifier folder, TRL's AutoModelForSequenceClassification) beside the functions.
    "reward_model_mixed": {"reward_model": True, "beta": 0.1, "reward_weights": [1.0, 0.5, 2.0]},
    "normalize_then_sum": {"multi_objective_aggregation": "normalize_then_sum", "reward_weights": [1.0, 0.5]},
    "generation_kwargs": {"generation_kwargs": {"top_k": 12, "typical_p": 0.9}, "beta": 0.1},
    # TRL's rollout_func: deterministic completions with an environment's reply in the middle (env_mask 0).
    "rollout_func": {"rollout_func": True, "beta": 0.1, "num_iterations": 2},
    "scale_batch_weights": {"scale_rewards": "batch", "reward_weights": [1.0, 0.5], "top_k": 20, "temperature": 0.9},
}

# Run on 2 processes (bench/grpo_goldens.py --processes 2, tests/llm/test_grpo_multiprocess.py): each process
# holds per_device_train_batch_size rows of every step, so a generation batch is twice one process's.
MULTIPROCESS_CASES = {
    "dapo_beta0": {"per_device_train_batch_size": 4},
    "dapo_beta": {"per_device_train_batch_size": 4, "beta": 0.1},
    "lora_beta": {
        "per_device_train_batch_size": 4,
        "beta": 0.1,
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    },
    # 3 rows per process and step, 2 steps a generation: 12 rows = 3 prompts x 4, so the second prompt's group
    # spans the two processes and its advantages need the other process's rewards.
    "grpo_spanning_groups": {
        "loss_type": "grpo",
        "beta": 0.1,
        "per_device_train_batch_size": 3,
        "gradient_accumulation_steps": 2,
        "num_iterations": 2,
        "max_steps": 4,
    },
    # Also what `lathe train` (stage grpo, NPROC_PER_NODE=2) is compared against: the ChatML template renders the
    # conversations as the tokenizer's chat template does.
    "conversational": {"per_device_train_batch_size": 4, "conversational": True, "beta": 0.1},
    "lora_beta0_batch": {
        "per_device_train_batch_size": 4,
        "scale_rewards": "batch",
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    },
}


def _texts(completions):
    """Plain completions, or conversational ones: [{"role": "assistant", "content": text}]."""
    return [c[0]["content"] if isinstance(c, list) else c for c in completions]


def vowel_share(completions, **kwargs):
    completions = _texts(completions)
    return [sum(ch in "aeiou" for ch in text) / (1 + len(text)) for text in completions]


def length_target(completions, target, **kwargs):
    completions = _texts(completions)
    return [-abs(len(text.split()) - t) / 4 for text, t in zip(completions, target)]


REWARDS = [vowel_share, length_target]


def build_model(folder, seed: int = 0) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for item in TOKENIZER.iterdir():
        shutil.copy(item, folder / item.name)
    config = LlamaConfig(
        vocab_size=len(AutoTokenizer.from_pretrained(str(TOKENIZER))),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
        # A constant feature that the end-of-sequence logit reads: about half the completions end early,
        # so the completion masks and the terminated-length metrics are exercised.
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight[2, 0] = 5.0
    model.save_pretrained(str(folder))
    build_reward_model(folder / "reward_model", config)


def build_reward_model(folder, config) -> None:
    """A tiny sequence classifier (one score) with seeded weights and the model's tokenizer: the reward model of
    the case reward_model_mixed, at <model folder>/reward_model."""
    import torch
    from transformers import LlamaForSequenceClassification

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for item in TOKENIZER.iterdir():
        shutil.copy(item, folder / item.name)
    config = config.__class__(**{**config.to_dict(), "num_labels": 1, "pad_token_id": 2})
    model = LlamaForSequenceClassification(config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if not name.endswith("norm.weight"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.save_pretrained(str(folder))


def rollout(prompts, trainer):
    """A rollout_func (TRL's signature): the model's turn (2-5 tokens drawn from the prompt's, varying within a
    group), an environment's reply (2 tokens, env_mask 0), the model's last token and the end-of-sequence id;
    a `turns` column for the reward functions."""
    tokenizer = trainer.processing_class
    prompt_ids = tokenizer(text=prompts)["input_ids"]
    completion_ids, env_mask = [], []
    for index, ids in enumerate(prompt_ids):
        own = [(token * 7 + index * 13) % 400 + 40 for token in ids * 3][: 2 + index % 4]
        completion_ids.append([*own, 17, 23, own[0], 2])
        env_mask.append([1] * len(own) + [0, 0, 1, 1])
    logprobs = [[0.0] * len(ids) for ids in completion_ids]
    turns = [2] * len(prompts)
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "logprobs": logprobs,
        "env_mask": env_mask,
        "turns": turns,
    }


def rollout_of(settings: dict):
    """The case's rollout_func (the key `rollout_func` is taken out of `settings`), or None."""
    return rollout if settings.pop("rollout_func", False) else None


def reward_funcs(functions, model_dir, settings: dict) -> list:
    """The case's reward functions: `functions`, then the reward model's folder when the case asks for one
    (the key `reward_model` is taken out of `settings`)."""
    if settings.pop("reward_model", False):
        return [*functions, str(Path(model_dir) / "reward_model")]
    return list(functions)


def dataset(conversational: bool = False):
    from datasets import Dataset

    if conversational:  # one-turn conversations, rendered with the chat template's generation prompt
        prompts = [[{"role": "user", "content": text}] for text in PROMPTS]
        return Dataset.from_dict({"prompt": prompts, "target": TARGETS})
    return Dataset.from_dict({"prompt": PROMPTS, "target": TARGETS})


def tokenizer(conversational: bool = False):
    """None (the model folder's tokenizer), or the same BPE vocabulary with a ChatML chat template."""
    if not conversational:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER.parent / "bpe_chatml"))


def record(trainer, generations) -> dict:
    """What a case is compared on: each step's log, and each generation batch's tokens, rewards, advantages."""
    logs = [
        {
            k: v
            for k, v in entry.items()
            if k not in ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
        }
        for entry in trainer.state.log_history
    ]
    return {"logs": logs, "generations": generations}


# RLOO (TRL's RLOOTrainer; bench/rloo_goldens.py, tests/llm/test_rloo.py; rloo_beta also through `lathe train` in
# test_grpo_stage.py, hence conversational): the KL penalty in the reward (beta > 0),
# several updates per generation with accumulation, the batch-normalised advantages and the reward clip, LoRA.
RLOO_CASES = {
    "rloo_beta": {"beta": 0.1, "conversational": True},
    "rloo_iter2_ga2_normalize_clip": {
        "beta": 0.0,
        "num_iterations": 2,
        "gradient_accumulation_steps": 2,
        "per_device_train_batch_size": 4,
        "normalize_advantages": True,
        "reward_clip_range": [-1.4, -0.7],
        "epsilon": 0.05,
    },
    "rloo_lora_beta": {"lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}, "num_iterations": 2},
}

# RLOO on 2 processes (bench/rloo_goldens.py --processes 2, tests/llm/test_grpo_multiprocess.py): the KL penalty
# and the leave-one-out baselines over the gathered rewards, 3 rows per process and step (a group spans them).
RLOO_MULTIPROCESS_CASES = {
    "rloo_2proc": {
        "beta": 0.1,
        "per_device_train_batch_size": 3,
        "gradient_accumulation_steps": 2,
        "num_generations": 4,
        "num_iterations": 2,
        "max_steps": 4,
    },
}


def assert_matches_trl(case: str, got: dict, expected: dict, log_rel: float, log_abs: float | None = None,
                       advantage_abs: float | None = None, exact: tuple[str, ...] = ()) -> None:  # fmt: skip
    """One run's record (`record`) against TRL's: per generation the sampled tokens, the `exact` keys and the
    rewards identical (sampling is exact), the advantages within 1e-5 relative (`advantage_abs` absolute); per
    logged step the same keys, each value within `log_rel` relative (`log_abs` absolute; None: the goldens'
    default)."""
    from tests.goldens import GOLDEN_ABS, assert_close_to_golden

    advantage_abs = GOLDEN_ABS if advantage_abs is None else advantage_abs
    log_abs = GOLDEN_ABS if log_abs is None else log_abs

    assert len(got["generations"]) == len(expected["generations"])
    for step, (mine, theirs) in enumerate(zip(got["generations"], expected["generations"])):
        assert mine["completion_ids"] == theirs["completion_ids"], f"generation {step}: sampled tokens differ"
        for key in exact:
            assert mine[key] == theirs[key], f"generation {step}: {key} differs"
        assert mine["rewards"] == theirs["rewards"], f"generation {step}"
        where = f"{case} advantages, {step}"
        assert_close_to_golden(mine["advantages"], theirs["advantages"], where, rel=1e-5, abs=advantage_abs)
    assert len(got["logs"]) == len(expected["logs"])
    for step, (mine, theirs) in enumerate(zip(got["logs"], expected["logs"]), start=1):
        assert set(mine) == set(theirs), f"step {step}: logged keys differ: {set(mine) ^ set(theirs)}"
        assert_close_to_golden(mine, theirs, f"{case} logs, step {step}", rel=log_rel, abs=log_abs)
