"""Pre-training rows (lathe.llm.data.pretrain): documents + EOS cut into cutoff_len blocks without losing a
token, whatever the preprocessing batch size or number of workers; compared with LLaMA-Factory 0.9.5's
blocks (tests/llm/golden/llamafactory_pretrain.json, made by make_llamafactory_pretrain.py)."""

import itertools
import json
import logging
import os
import random
from types import SimpleNamespace

import pytest

pytest.importorskip("datasets")
pytest.importorskip("transformers")

from lathe.llm.data.pretrain import preprocess_pretrain_dataset, pretrain_blocks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden", "llamafactory_pretrain.json")
WORDS = "hello what two plus four add sum name a b result is ok".split()


def canonical(texts):
    import datasets

    return datasets.Dataset.from_dict({"_prompt": [[{"role": "user", "content": text}] for text in texts]})


def blocks_of(texts, tokenizer, cutoff_len, batch_size=1000, num_proc=None, packing=True, template=None):
    data_args = SimpleNamespace(cutoff_len=cutoff_len, packing=packing, template=template)
    dataset = pretrain_blocks(canonical(texts), tokenizer, data_args, {"batch_size": batch_size, "num_proc": num_proc})
    return dataset["input_ids"]


def document_tokens(texts, tokenizer):
    return [tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"] for text in texts]


def random_texts(count, seed=0, longest=13):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, longest))) for _ in range(count)]


@pytest.fixture(scope="module")
def golden():
    with open(GOLDEN, encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture
def bpe_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.join(HERE, "golden", "tokenizers", "bpe"))


# ---------------------------------------------------------------- no token lost


@pytest.mark.parametrize("batch_size", [1, 3, 7, 1000])
def test_every_token_kept_whatever_the_batch_size(word_tokenizer, batch_size):
    texts = random_texts(40)
    stream = list(itertools.chain.from_iterable(document_tokens(texts, word_tokenizer)))
    blocks = blocks_of(texts, word_tokenizer, cutoff_len=8, batch_size=batch_size)
    assert list(itertools.chain.from_iterable(blocks)) == stream  # every token, in order, once
    assert all(len(block) == 8 for block in blocks[:-1]) and 0 < len(blocks[-1]) <= 8
    assert len(stream) % 8 != 0 and len(blocks[-1]) == len(stream) % 8  # the short last block is kept
    # the same rows as one call over all documents (the contract's batch function)
    whole = preprocess_pretrain_dataset(
        canonical(texts).to_dict(), word_tokenizer, SimpleNamespace(cutoff_len=8, template=None)
    )
    assert whole["input_ids"] == blocks


def test_non_padding_tokens_after_collation_equal_the_documents_tokens(word_tokenizer):
    from lathe.llm.workflows.pt import PretrainCollator

    word_tokenizer.pad_token = word_tokenizer.eos_token
    texts = random_texts(25, seed=3)
    blocks = blocks_of(texts, word_tokenizer, cutoff_len=16, batch_size=2)
    batch = PretrainCollator(word_tokenizer, pad_to_multiple_of=8)([{"input_ids": block} for block in blocks])
    assert int(batch["attention_mask"].sum()) == sum(len(ids) for ids in document_tokens(texts, word_tokenizer))
    assert int(batch["labels"].ne(-100).sum()) == int(batch["attention_mask"].sum())


def test_workers_give_the_same_blocks(word_tokenizer):
    texts = random_texts(30, seed=5)
    assert blocks_of(texts, word_tokenizer, 8, batch_size=4, num_proc=2) == blocks_of(texts, word_tokenizer, 8)


def test_a_document_longer_than_many_batches_of_blocks(word_tokenizer):
    texts = ["hello two", " ".join(["ok"] * 50), "a b", "", "sum a"]
    stream = list(itertools.chain.from_iterable(document_tokens(texts, word_tokenizer)))
    blocks = blocks_of(texts, word_tokenizer, cutoff_len=6, batch_size=1)
    assert list(itertools.chain.from_iterable(blocks)) == stream
    assert len(stream) % 6 and [len(block) for block in blocks] == [6] * (len(stream) // 6) + [len(stream) % 6]


def test_get_dataset_keeps_every_token_with_small_preprocessing_batches(word_tokenizer, tmp_path):
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.pipeline import get_dataset
    from lathe.llm.templates.resolve import get_template_and_fix_tokenizer

    data_args = DataArguments(
        dataset_dir=os.path.join(HERE, "data"),
        dataset="pretrain_txt",
        cutoff_len=4,
        preprocessing_batch_size=1,
        packing=True,
    )
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args)
    module = get_dataset(
        template, SimpleNamespace(), data_args, SimpleNamespace(seed=42), "pt", word_tokenizer, cache_dir=str(tmp_path)
    )
    with open(os.path.join(HERE, "data", "pretrain.txt"), encoding="utf-8") as handle:
        texts = [line.rstrip("\n") for line in handle if line.strip()]
    stream = list(itertools.chain.from_iterable(document_tokens(texts, word_tokenizer)))
    rows = module["train_dataset"]["input_ids"]
    assert list(itertools.chain.from_iterable(rows)) == stream
    assert all(len(row) == 4 for row in rows[:-1])


# ---------------------------------------------------------------- BOS, EOS, packing off


def test_tokenizers_that_add_bos_start_every_block_with_it(bpe_tokenizer):
    bpe_tokenizer.add_bos_token = True
    texts = random_texts(12, seed=1)
    bos = bpe_tokenizer.bos_token_id
    stream = list(itertools.chain.from_iterable(document_tokens(texts, bpe_tokenizer)))
    blocks = blocks_of(texts, bpe_tokenizer, cutoff_len=10, batch_size=3)
    assert all(block[0] == bos for block in blocks) and all(len(block) == 10 for block in blocks[:-1])
    assert list(itertools.chain.from_iterable(block[1:] for block in blocks)) == stream


def test_cutoff_len_must_leave_room_after_bos(bpe_tokenizer):
    bpe_tokenizer.add_bos_token = True
    with pytest.raises(ValueError, match="cutoff_len >= 2"):
        blocks_of(["hello"], bpe_tokenizer, cutoff_len=1)


def test_llama3_template_ends_documents_with_end_of_text():
    class RecordingTokenizer:
        eos_token, bos_token_id = "</s>", None

        def __init__(self):
            self.texts = []

        def __call__(self, texts, add_special_tokens=True):
            assert add_special_tokens is False
            self.texts += texts
            return {"input_ids": [[len(text)] for text in texts]}

    for template, ending in (("llama3", "<|end_of_text|>"), ("qwen", "</s>"), (None, "</s>")):
        tokenizer = RecordingTokenizer()
        preprocess_pretrain_dataset(
            {"_prompt": [[{"role": "user", "content": "doc"}]]},
            tokenizer,
            SimpleNamespace(cutoff_len=4, template=template),
        )
        assert tokenizer.texts == ["doc" + ending]


def test_packing_off_gives_one_document_per_row_and_splits_long_ones(bpe_tokenizer):
    bpe_tokenizer.add_bos_token = True
    texts = ["The quick brown fox jumps over the lazy dog .", "two", ""]
    documents = document_tokens(texts, bpe_tokenizer)
    rows = blocks_of(texts, bpe_tokenizer, cutoff_len=5, packing=False, batch_size=2)
    bos = bpe_tokenizer.bos_token_id
    expected = []
    for document in documents:
        with_bos = [bos] + document
        expected += [with_bos[start : start + 5] for start in range(0, len(with_bos), 5)]
    assert rows == expected and len(documents[0]) + 1 > 5  # the first document was split, not truncated


def test_rows_without_text_are_counted(word_tokenizer, caplog):
    examples = {"_prompt": [[{"role": "user", "content": "hello"}], [], [{"role": "user", "content": ""}]]}
    with caplog.at_level(logging.WARNING, logger="lathe.llm.data"):
        result = preprocess_pretrain_dataset(examples, word_tokenizer, SimpleNamespace(cutoff_len=8, template=None))
    eos = word_tokenizer.eos_token_id
    assert result["input_ids"] == [word_tokenizer.convert_tokens_to_ids(["hello"]) + [eos, eos]]
    assert "skipped 1 of 3 rows without text" in caplog.text


# ---------------------------------------------------------------- LLaMA-Factory 0.9.5


def test_llamafactory_golden_was_made_from_these_documents(golden):
    from tests.llm.golden.make_llamafactory_pretrain import documents

    assert golden["documents"] == documents() and golden["versions"]["llamafactory"] == "0.9.5"


def test_same_blocks_as_llamafactory_where_it_keeps_the_tokens(golden, bpe_tokenizer):
    """One preprocessing batch: LLaMA-Factory's blocks are lathe's, except the tail it drops."""
    case = golden["cases"][0]
    texts = golden["documents"]
    stream = list(itertools.chain.from_iterable(document_tokens(texts, bpe_tokenizer)))
    blocks = blocks_of(texts, bpe_tokenizer, case["cutoff_len"])
    assert blocks[: len(case["input_ids"])] == case["input_ids"]
    dropped = len(stream) % case["cutoff_len"]
    assert dropped > 0 and blocks[len(case["input_ids"]) :] == [stream[-dropped:]]


def test_llamafactory_drops_a_tail_per_preprocessing_batch_and_lathe_does_not(golden, bpe_tokenizer):
    case = golden["cases"][1]
    texts, size, cutoff = golden["documents"], case["preprocessing_batch_size"], case["cutoff_len"]
    documents = document_tokens(texts, bpe_tokenizer)
    batch_lengths = [sum(map(len, documents[start : start + size])) for start in range(0, len(texts), size)]
    lost = sum(length % cutoff for length in batch_lengths)
    assert sum(map(len, case["input_ids"])) == sum(batch_lengths) - lost and lost > cutoff  # LLaMA-Factory
    blocks = blocks_of(texts, bpe_tokenizer, cutoff, batch_size=size)
    assert sum(map(len, blocks)) == sum(batch_lengths)  # lathe: every token
    assert blocks == blocks_of(texts, bpe_tokenizer, cutoff)  # and the same blocks as in one batch
    assert blocks[: batch_lengths[0] // cutoff] == case["input_ids"][: batch_lengths[0] // cutoff]


def test_bos_is_inserted_where_llamafactory_overwrites_a_token(golden, bpe_tokenizer):
    case = golden["cases"][2]
    bpe_tokenizer.add_bos_token = True
    bos, cutoff = bpe_tokenizer.bos_token_id, case["cutoff_len"]
    stream = list(itertools.chain.from_iterable(document_tokens(golden["documents"], bpe_tokenizer)))
    for index, block in enumerate(case["input_ids"]):  # LLaMA-Factory: BOS written over a document token
        assert block == [bos] + stream[index * cutoff + 1 : (index + 1) * cutoff]
    blocks = blocks_of(golden["documents"], bpe_tokenizer, cutoff)
    for index, block in enumerate(blocks):  # lathe: BOS, then the next cutoff_len - 1 tokens
        assert block == [bos] + stream[index * (cutoff - 1) : (index + 1) * (cutoff - 1)]
