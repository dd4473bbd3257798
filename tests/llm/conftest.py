"""Tiny offline assets for the lathe.llm tests: a byte-level BPE tokenizer trained here and a small
Llama model saved with save_pretrained, built once per test session.

Fixtures:
- `tiny_tokenizer_dir`: a folder with a PreTrainedTokenizerFast (bos <s>, eos </s>, no pad token,
  chatml markers <|im_start|>/<|im_end|> as special tokens, no chat_template).
- `tiny_model_dir`: that tokenizer plus a 3-layer LlamaForCausalLM (hidden 32, GQA 4/2 heads).
- `write_yaml(path, mapping)`: a helper fixture that writes a config file and returns its path.
"""

from __future__ import annotations

import pytest

TOKENIZER_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is two plus two? Two plus two is four.",
    "Reverse the string abc: cba. Reverse hello: olleh.",
    "You are a helpful assistant. Answer the question briefly.",
    "user assistant system observation function tool call result",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - = ?",
]
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def build_tiny_tokenizer(folder) -> None:
    """Train a ~400-token byte-level BPE on TOKENIZER_CORPUS and save it as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(TOKENIZER_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tokenizer.save_pretrained(str(folder))


def build_tiny_model(folder, vocab_size: int) -> None:
    """A 3-layer Llama (about 60k parameters) with random weights, saved in float32 safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(folder))


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer_dir):
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny_model")
    for item in __import__("pathlib").Path(tiny_tokenizer_dir).iterdir():
        shutil.copy(item, folder / item.name)
    build_tiny_model(folder, vocab_size=len(AutoTokenizer.from_pretrained(tiny_tokenizer_dir)))
    return str(folder)


@pytest.fixture
def write_yaml():
    import yaml

    def write(path, mapping: dict) -> str:
        path.write_text(yaml.safe_dump(mapping, sort_keys=False), encoding="utf-8")
        return str(path)

    return write


# ---- A word-level tokenizer for golden tests written by hand (tests/llm/test_templates.py, test_supervised.py).
# Words, single punctuation characters and "\n" are tokens; spaces are dropped; the chat markers of every
# built-in template are added tokens. Ids come from WORD_VOCAB's order, so a test can write the tokens it
# expects and look their ids up without going through the tokenizer's own splitting.
WORD_SPECIAL_TOKENS = [
    "<unk>",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
]
WORD_TEXT_TOKENS = (
    ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>", "\n"]
    + list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
    + [str(number) for number in range(21)]
    + """Human Assistant System Instruction Response Below is an instruction that describes a task Write
    response appropriately completes the request user assistant system tool ipython You are Qwen created by
    Alibaba Cloud helpful SYS hi hello what two plus four add sum name arguments parameters a b result is
    be brief thinking ok Tools Action Input type function description properties required integer object
    number first second content""".split()
)


def build_word_tokenizer():
    """A fresh PreTrainedTokenizerFast: word level, bos <s>, eos </s>, no pad token, no chat_template."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(dict.fromkeys(WORD_SPECIAL_TOKENS + WORD_TEXT_TOKENS))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed"),
            pre_tokenizers.Split(
                Regex(r"\n|<(?:/?(?:tool_call|tool_response|think))>|\w+|[^\w\s]"), behavior="isolated"
            ),
        ]
    )
    backend.add_special_tokens([AddedToken(token, normalized=False) for token in WORD_SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture
def word_tokenizer():
    return build_word_tokenizer()
