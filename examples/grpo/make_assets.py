"""Writes what examples/grpo/digits.yaml reads: a word-level tokenizer ("repeat", the ten digits, <pad> <s>
</s>) and a tiny Llama's config.json (no weights: lathe train starts from seeded random weights) in
examples/grpo/digits/model, and 32 prompts "repeat <d>" with their `digit` column in examples/grpo/digits/data.

Run from the repository root: python examples/grpo/make_assets.py
"""

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent / "digits"
DIGITS = [str(d) for d in range(10)]


def make_tokenizer() -> PreTrainedTokenizerFast:
    """Word level: <pad> <s> </s>, "repeat" and the ten digits (grpo_digits.py builds its model on it too)."""
    vocab = {token: index for index, token in enumerate(["<pad>", "<s>", "</s>", "repeat", *DIGITS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def model_config(vocab_size: int) -> LlamaConfig:
    """The tiny Llama both GRPO examples train."""
    return LlamaConfig(
        vocab_size=vocab_size,
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


def main():
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(HERE / "model")
    model_config(len(tokenizer)).save_pretrained(HERE / "model")
    (HERE / "data").mkdir(parents=True, exist_ok=True)
    rows = [{"messages": [{"role": "user", "content": f"repeat {d}"}], "digit": d} for d in (3, 7)] * 16
    (HERE / "data" / "digits.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    info = {"digits": {"file_name": "digits.jsonl", "formatting": "openai", "columns": {"messages": "messages"}}}
    info["digits"]["tags"] = {**tags, "system_tag": "system"}
    (HERE / "data" / "dataset_info.json").write_text(json.dumps(info, indent=2) + "\n")


if __name__ == "__main__":
    main()
