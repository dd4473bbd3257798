"""GRPO on CPU in under a minute (about 10 s of compute): teach a tiny random Llama to answer "repeat 3" with 3s and "repeat 7" with 7s.

The reward is verifiable (the share of answer tokens equal to the row's `digit` column: TRL's calling
convention hands every dataset column to reward functions as a keyword argument), so no reward model is
needed. The mean reward (logged as `reward`) rises from about 0.1 (chance: 1 word in 14)
to 1.0 (here, averaged over every 20 steps: 0.27 0.48 0.87 1.00 1.00 1.00).

Run: python examples/grpo/grpo_digits.py
"""

import tempfile

import torch
from datasets import Dataset
from make_assets import make_tokenizer, model_config  # beside this file: the same tokenizer and model
from transformers import LlamaForCausalLM

from lathe.llm.rl import GRPOConfig, GRPOTrainer


def digit_match(completions, digit, **kwargs):
    """Share of the answer's words that are the asked digit (0 for an empty answer)."""
    return [
        sum(word == str(d) for word in text.split()) / max(1, len(text.split())) for text, d in zip(completions, digit)
    ]


def main():
    torch.set_num_threads(1)
    tokenizer = make_tokenizer()
    config = model_config(len(tokenizer))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    rows = [{"prompt": f"repeat {d}", "digit": d} for d in (3, 7)] * 16
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="grpo_digits_"),
        per_device_train_batch_size=16,
        num_generations=8,
        max_completion_length=6,
        learning_rate=2e-2,
        lr_scheduler_type="constant",
        max_steps=120,
        logging_steps=20,
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=digit_match,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.train()
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    print("reward every 20 steps:", " ".join(f"{r:.2f}" for r in rewards))


if __name__ == "__main__":
    main()
