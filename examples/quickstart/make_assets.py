"""Regenerate the LLM quickstart's assets: the model folder (config.json and a character-level
tokenizer, no weights) and the string-reversal data set. The generated files are committed, so the
quickstart (`lathe train examples/quickstart.yaml`) never runs this; run it only to change them:

    python examples/quickstart/make_assets.py

The output is deterministic: the same files, byte for byte, on every run.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "model"
DATA_DIR = HERE / "data"

SEED = 0
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# 26**5 strings of the shortest length alone: guessing a held-out answer succeeds essentially never.
MIN_LENGTH, MAX_LENGTH = 5, 12
TRAIN_EXAMPLES = 10_000
TEST_EXAMPLES = 500

# Every printable ASCII character and the newline is a token of its own: reversing a string is then
# reversing its tokens, which a small model learns in minutes (with merged multi-character tokens it
# would have to learn each token's spelling first). The chatml role names are whole tokens only to
# keep the sequences short.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ROLE_WORDS = ["system", "user", "assistant", "tool"]
CHARACTERS = ["\n"] + [chr(code) for code in range(32, 127)]


def build_tokenizer():
    """A word-level tokenizer whose words are single characters (and the role names): lossless, so
    decoding a generated answer gives back exactly its text."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + ROLE_WORDS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=None))
    roles = "|".join(ROLE_WORDS)
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(rf"{roles}|[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join the characters back without spaces between them
    backend.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in SPECIAL_TOKENS])
    # As Qwen2 does: <|endoftext|> pads and ends documents; the chatml template makes <|im_end|> the
    # EOS of a chat turn when the tokenizer is loaded for training.
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=64,
        clean_up_tokenization_spaces=False,
    )


def build_model_config(vocab_size: int):
    """A small Llama (538k parameters); `train_from_scratch: true` draws its weights.

    Llama rather than Qwen2: transformers 5 loads a qwen2 folder's tokenizer as Qwen2Tokenizer,
    which rebuilds Qwen's byte-level pipeline and ignores this character-level tokenizer.json."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index("<|im_end|>"),
        pad_token_id=0,
        dtype="float32",
    )


def make_examples(rng: random.Random) -> tuple[list[dict], list[dict]]:
    """Distinct random lowercase strings and their reversals; a test string never appears in training."""
    seen: set[str] = set()
    rows = []
    while len(rows) < TRAIN_EXAMPLES + TEST_EXAMPLES:
        text = "".join(rng.choice(LETTERS) for _ in range(rng.randint(MIN_LENGTH, MAX_LENGTH)))
        if text in seen:
            continue
        seen.add(text)
        rows.append({"instruction": text, "output": text[::-1]})
    return rows[:TRAIN_EXAMPLES], rows[TRAIN_EXAMPLES:]


def write_json_lines(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)


def write_assets(model_dir: Path = MODEL_DIR, data_dir: Path = DATA_DIR) -> None:
    """The model folder and the data folder (tests regenerate them elsewhere to compare)."""
    model_dir, data_dir = Path(model_dir), Path(data_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(str(model_dir))
    build_model_config(len(tokenizer)).save_pretrained(str(model_dir))

    train, test = make_examples(random.Random(SEED))
    write_json_lines(data_dir / "reverse_train.jsonl", train)
    write_json_lines(data_dir / "reverse_test.jsonl", test)
    registry = {
        "reverse_train": {"file_name": "reverse_train.jsonl"},
        "reverse_test": {"file_name": "reverse_test.jsonl"},
    }
    (data_dir / "dataset_info.json").write_text(json.dumps(registry, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {model_dir} ({len(tokenizer)} tokens) and {data_dir} ({len(train)} train, {len(test)} test examples)")


if __name__ == "__main__":
    write_assets()
