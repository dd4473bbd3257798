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
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from lathe.llm.rl import GRPOConfig, GRPOTrainer

DIGITS = [str(d) for d in range(10)]


def make_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate(["<pad>", "<s>", "</s>", "repeat", *DIGITS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def digit_match(completions, digit, **kwargs):
    """Share of the answer's words that are the asked digit (0 for an empty answer)."""
    return [
        sum(word == str(d) for word in text.split()) / max(1, len(text.split())) for text, d in zip(completions, digit)
    ]


def main():
    torch.set_num_threads(1)
    tokenizer = make_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
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
