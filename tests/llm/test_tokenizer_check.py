"""The loaded tokenizer must encode as its folder's tokenizer.json does (lathe/llm/model/tokenizer_check.py):
transformers 5 loads a model_type qwen2 folder as Qwen2Tokenizer whatever its tokenizer.json holds."""

import json
import time

import pytest

from lathe.llm.config.train import parse_train_config
from lathe.llm.model.loader import load_tokenizer
from lathe.llm.model.tokenizer_check import TokenizerMismatchError, check_tokenizer_matches_file

pytest.importorskip("transformers")
WORDS = ["<unk>", "<|endoftext|>", "hello", "world", "the", "cat", "sat", "on", "mat"]


def _word_level_folder(folder, model_type: str, unknown: str | None = "<unk>") -> str:
    """A word-level tokenizer.json saved by PreTrainedTokenizerFast, beside a config.json of `model_type`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: index for index, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=unknown) if unknown else models.WordLevel(vocab))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", unk_token=unknown).save_pretrained(
        str(folder)
    )
    config = {"model_type": model_type, "vocab_size": len(WORDS), "hidden_size": 8, "num_attention_heads": 2}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(folder)


def _load(folder):
    return load_tokenizer(parse_train_config({"model_name_or_path": folder, "dataset": "d", "output_dir": "o"}).model)


def test_a_word_level_tokenizer_in_a_qwen2_folder_stops_with_what_disagreed(tmp_path):
    folder = _word_level_folder(tmp_path, "qwen2")
    with pytest.raises(TokenizerMismatchError) as caught:
        _load(folder)
    message = str(caught.value)
    assert f"The tokenizer loaded from {folder} (Qwen2Tokenizer, a BPE model)" in message
    assert "tokenizer.json (WordLevel model)" in message
    assert "for model_type 'qwen2' (config.json)" in message
    assert "first difference at token 0" in message and "sample 'Hello world!" in message


def test_the_same_tokenizer_loads_in_a_llama_folder_and_encodes_as_its_file(tmp_path):
    from tokenizers import Tokenizer

    folder = _word_level_folder(tmp_path, "llama")
    tokenizer = _load(folder)
    text = "hello world the cat sat on the mat"
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == [2, 3, 4, 5, 6, 7, 4, 8]
    assert Tokenizer.from_file(f"{folder}/tokenizer.json").encode(text).ids == [2, 3, 4, 5, 6, 7, 4, 8]


def test_a_vocabulary_without_an_unknown_token_is_checked_on_its_own_words(tmp_path):
    # The fixed sample cannot be encoded by such a tokenizer (tokenizers raises): the check uses its words.
    tokenizer = _load(_word_level_folder(tmp_path, "llama", unknown=None))
    assert tokenizer("hello cat", add_special_tokens=False)["input_ids"] == [2, 5]
    qwen2 = tmp_path / "qwen2"
    qwen2.mkdir()
    with pytest.raises(TokenizerMismatchError, match="first difference at token 0"):
        _load(_word_level_folder(qwen2, "qwen2", unknown=None))


def test_normal_folders_pass_and_the_check_is_cheap(tiny_tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    start = time.perf_counter()
    check_tokenizer_matches_file(tokenizer, tiny_tokenizer_dir)
    assert time.perf_counter() - start < 0.2
    assert _load(tiny_tokenizer_dir).is_fast
    # A folder without tokenizer.json (nothing to compare with) passes untouched.
    check_tokenizer_matches_file(tokenizer, str(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "llama3", "gemma3"])
def test_real_tokenizers_pass_and_the_check_costs_little(family):
    from transformers import AutoTokenizer

    from tests.llm.real_tokenizers import npm_tokenizer

    folder = str(npm_tokenizer(family))
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    loading = time.perf_counter() - start
    start = time.perf_counter()
    check_tokenizer_matches_file(tokenizer, folder)
    # Reading the 128k-262k token tokenizer.json once more: about as long as loading the tokenizer took.
    assert time.perf_counter() - start < 2 * loading
