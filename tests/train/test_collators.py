"""Tests for lathe.train.data.collators (and the padding they rely on): exact batches, errors, parity with transformers."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from lathe.train.data.collators import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    DefaultDataCollator,
    default_data_collator,
)
from lathe.train.data.padding import pad_batch

PAD, UNK, MASK, EOS = 0, 1, 2, 3
SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song", "my cat ran to the mat"]


class MiniTokenizer:
    """The least a collator needs: no `pad` method, so lathe's own padding runs."""

    def __init__(self, padding_side="right", pad_token_id=PAD, mask_token_id=MASK):
        self.padding_side = padding_side
        self.pad_token_id = pad_token_id
        self.mask_token_id = mask_token_id
        self.eos_token_id = EOS
        self.unk_token_id = UNK

    def __len__(self):
        return 20


def assert_batches_equal(actual, expected):
    assert sorted(actual.keys()) == sorted(expected.keys())
    for key in expected:
        if isinstance(expected[key], torch.Tensor):
            assert actual[key].dtype == expected[key].dtype, key
            assert torch.equal(actual[key], expected[key]), key
        else:
            assert actual[key] == expected[key], key


def t(rows, dtype=torch.long):
    return torch.tensor(rows, dtype=dtype)


@pytest.fixture(scope="module")
def hf_tokenizer():
    """A real transformers tokenizer, trained offline on four sentences (word level)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[MASK]", "[EOS]"])
    backend.train_from_iterator(SENTENCES, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]", eos_token="[EOS]"
    )
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.mask_token_id) == (PAD, UNK, MASK)
    return tokenizer


@pytest.fixture
def hf_collators():
    return pytest.importorskip("transformers.data.data_collator")


def without_pad_method(tokenizer, padding_side=None):
    """The attributes of a transformers tokenizer without its `pad`, to run lathe's padding on them."""
    return types.SimpleNamespace(
        pad_token_id=tokenizer.pad_token_id,
        padding_side=padding_side or tokenizer.padding_side,
        model_input_names=tokenizer.model_input_names,
        model_max_length=tokenizer.model_max_length,
    )


def encode(tokenizer, sentences, **kwargs):
    return [dict(tokenizer(sentence, **kwargs)) for sentence in sentences]


# ---------------------------------------------------------------------------- default_data_collator


def test_default_collator_dicts_label_dtypes_and_skipped_fields():
    features = [
        {"input_ids": [1, 2], "label": 1, "text": "a", "extra": None, "scores": np.array([0.5, 1.0])},
        {"input_ids": [3, 4], "label": 0, "text": "b", "extra": None, "scores": np.array([1.5, 2.0])},
    ]
    batch = default_data_collator(features)
    assert_batches_equal(
        batch,
        {"labels": t([1, 0]), "input_ids": t([[1, 2], [3, 4]]), "scores": t([[0.5, 1.0], [1.5, 2.0]], torch.float64)},
    )
    regression = default_data_collator([{"label": 0.5}, {"label": 2.0}])
    assert_batches_equal(regression, {"labels": t([0.5, 2.0], torch.float)})
    # like transformers: only int labels are classes; a list label is multi-label, hence float
    multi_label = default_data_collator([{"label": [0, 1]}, {"label": [1, 1]}])
    assert_batches_equal(multi_label, {"labels": t([[0, 1], [1, 1]], torch.float)})
    tensor_label = default_data_collator([{"label": torch.tensor(3)}, {"label": torch.tensor(4)}])
    assert_batches_equal(tensor_label, {"labels": t([3, 4])})


def test_default_collator_label_ids_and_tensors():
    ints = default_data_collator([{"label_ids": [1, 2]}, {"label_ids": [3, 4]}])
    assert_batches_equal(ints, {"labels": t([[1, 2], [3, 4]])})
    floats = default_data_collator([{"label_ids": [0.5]}, {"label_ids": [1.5]}])
    assert_batches_equal(floats, {"labels": t([[0.5], [1.5]], torch.float)})
    tensors = default_data_collator(
        [{"label_ids": torch.tensor([1, 2], dtype=torch.int32), "x": torch.ones(2)} for _ in range(2)]
    )
    assert_batches_equal(tensors, {"labels": t([[1, 2], [1, 2]], torch.int32), "x": torch.ones(2, 2)})


def test_default_collator_objects_use_their_fields():
    @dataclasses.dataclass
    class Item:
        input_ids: list
        label: int

    batch = default_data_collator([Item([1, 2], 0), Item([3, 4], 1)])
    assert_batches_equal(batch, {"labels": t([0, 1]), "input_ids": t([[1, 2], [3, 4]])})


def test_default_collator_tuples_collate_position_wise():
    batch = default_data_collator([(torch.ones(2), 1), (torch.zeros(2), 0)])
    assert isinstance(batch, tuple) and len(batch) == 2
    assert torch.equal(batch[0], t([[1.0, 1.0], [0.0, 0.0]], torch.float))
    assert torch.equal(batch[1], t([1, 0]))
    dataset = torch.utils.data.TensorDataset(torch.arange(6.0).view(3, 2), torch.tensor([0, 1, 0]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, collate_fn=default_data_collator)
    inputs, targets = next(iter(loader))
    assert torch.equal(inputs, torch.arange(6.0).view(3, 2)) and torch.equal(targets, t([0, 1, 0]))


@pytest.mark.parametrize("item", [3, "some text", [1, 2, 3], torch.ones(2), (torch.ones(1), "x")])
def test_default_collator_rejects_unsupported_items(item):
    with pytest.raises(TypeError, match="dict of fields.*tuple of tensors") as error:
        default_data_collator([item, item])
    assert type(item).__name__ in str(error.value)


def test_default_collator_errors():
    with pytest.raises(ValueError, match="return_tensors must be 'pt'.*or 'np'"):
        default_data_collator([{"x": 1}], return_tensors="tf")
    with pytest.raises(ValueError, match="return_tensors must be 'pt'.*or 'np'"):
        DefaultDataCollator(return_tensors="jax")
    with pytest.raises(ValueError, match="'input_ids'"):  # ragged: needs a padding collator
        default_data_collator([{"input_ids": [1, 2]}, {"input_ids": [1]}])
    with pytest.raises(ValueError, match="4 elements|2 elements"):
        default_data_collator([(torch.ones(1), 1), (torch.ones(1), 1, 2, 3)])
    assert DefaultDataCollator()([{"x": 1}]) == {"x": t([1])}


def test_collators_do_not_import_transformers():
    code = "import sys, lathe.train.data.collators; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.hf
def test_default_collator_matches_transformers(hf_collators):
    cases = [
        [{"input_ids": [1, 2], "label": 1, "text": "a"}, {"input_ids": [3, 4], "label": 0, "text": "b"}],
        [{"x": np.array([1.0, 2.0]), "label": 0.5}, {"x": np.array([3.0, 4.0]), "label": 1.5}],
        [{"label_ids": [1, 2], "mask": torch.ones(2)}, {"label_ids": [3, 4], "mask": torch.zeros(2)}],
        [{"label_ids": torch.tensor([1.0]), "label": None}, {"label_ids": torch.tensor([2.0]), "label": None}],
    ]
    for features in cases:
        assert_batches_equal(default_data_collator(features), hf_collators.default_data_collator(features))


# ---------------------------------------------------------------------------- padding collators


def test_padding_right_and_left_with_labels():
    features = [{"input_ids": [5, 6], "label": 1}, {"input_ids": [7, 8, 9], "label": 0}]
    right = DataCollatorWithPadding(MiniTokenizer("right"))(features)
    assert_batches_equal(
        right,
        {"input_ids": t([[5, 6, 0], [7, 8, 9]]), "attention_mask": t([[1, 1, 0], [1, 1, 1]]), "labels": t([1, 0])},
    )
    left = DataCollatorWithPadding(MiniTokenizer("left"))(features)
    assert_batches_equal(
        left,
        {"input_ids": t([[0, 5, 6], [7, 8, 9]]), "attention_mask": t([[0, 1, 1], [1, 1, 1]]), "labels": t([1, 0])},
    )


def test_padding_multiple_max_length_and_extra_fields():
    features = [
        {"input_ids": torch.tensor([5, 6]), "token_type_ids": [0, 0], "special_tokens_mask": [0, 0], "label_ids": 3},
        {"input_ids": torch.tensor([7, 8, 9]), "token_type_ids": [0, 1], "special_tokens_mask": [0, 0], "label_ids": 4},
    ]
    features[1]["token_type_ids"] = [0, 1, 1]
    features[1]["special_tokens_mask"] = [1, 0, 0]
    batch = DataCollatorWithPadding(MiniTokenizer(), pad_to_multiple_of=4)(features)
    assert_batches_equal(
        batch,
        {
            "input_ids": t([[5, 6, 0, 0], [7, 8, 9, 0]]),
            "token_type_ids": t([[0, 0, 0, 0], [0, 1, 1, 0]]),
            "special_tokens_mask": t([[0, 0, 1, 1], [1, 0, 0, 1]]),
            "attention_mask": t([[1, 1, 0, 0], [1, 1, 1, 0]]),
            "labels": t([3, 4]),
        },
    )
    fixed = DataCollatorWithPadding(MiniTokenizer("left"), padding="max_length", max_length=5)(
        [{"input_ids": [5, 6]}, {"input_ids": [7]}]
    )
    assert_batches_equal(
        fixed,
        {"input_ids": t([[0, 0, 0, 5, 6], [0, 0, 0, 0, 7]]), "attention_mask": t([[0, 0, 0, 1, 1], [0, 0, 0, 0, 1]])},
    )
    # padding=False still builds the attention mask; equal lengths need no pad token at all
    unpadded = DataCollatorWithPadding(MiniTokenizer(pad_token_id=None), padding=False)([{"input_ids": [5]}] * 2)
    assert_batches_equal(unpadded, {"input_ids": t([[5], [5]]), "attention_mask": t([[1], [1]])})


def test_padding_errors():
    with pytest.raises(ValueError, match=r"tokenizer\.pad_token"):
        DataCollatorWithPadding(MiniTokenizer(pad_token_id=None))([{"input_ids": [1]}, {"input_ids": [1, 2]}])
    with pytest.raises(ValueError, match="return_tensors must be 'pt'.*or 'np'"):
        DataCollatorWithPadding(MiniTokenizer(), return_tensors="tf")
    with pytest.raises(ValueError, match="padding must be"):
        DataCollatorWithPadding(MiniTokenizer(), padding="shortest")
    with pytest.raises(ValueError, match="'input_ids'"):
        DataCollatorWithPadding(MiniTokenizer())([{"tokens": [1]}])
    with pytest.raises(ValueError, match="'text'"):  # strings cannot become tensors, as in transformers
        DataCollatorWithPadding(MiniTokenizer())([{"input_ids": [1], "text": "a"}] * 2)


def test_missing_pad_token_on_a_transformers_tokenizer(hf_tokenizer):
    tokenizer = copy.deepcopy(hf_tokenizer)
    tokenizer.pad_token = None
    features = [{"input_ids": [5]}, {"input_ids": [5, 6]}]
    for collator in (DataCollatorWithPadding(tokenizer), DataCollatorForSeq2Seq(tokenizer)):
        with pytest.raises(ValueError, match="pad_token"):
            collator(features)
    with pytest.raises(ValueError, match=r"tokenizer\.pad_token"):
        DataCollatorForLanguageModeling(tokenizer, mlm=False)([[5], [5, 6]])


PADDING_CASES = [
    dict(),
    dict(pad_to_multiple_of=8),
    dict(padding="max_length", max_length=12),
    dict(padding="longest", pad_to_multiple_of=3),
]


@pytest.mark.hf
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("options", PADDING_CASES)
def test_padding_matches_transformers(hf_tokenizer, hf_collators, side, options):
    hf_tokenizer.padding_side = side
    try:
        features = encode(hf_tokenizer, SENTENCES[:3] + ["cat"], return_token_type_ids=True)
        for feature, label in zip(features, [0, 1, 1, 0]):
            feature["label"] = label
        expected = hf_collators.DataCollatorWithPadding(hf_tokenizer, **options)(features)
        through_tokenizer = DataCollatorWithPadding(hf_tokenizer, **options)(features)
        own_padding = DataCollatorWithPadding(without_pad_method(hf_tokenizer), **options)(features)
    finally:
        hf_tokenizer.padding_side = "right"
    assert_batches_equal(dict(through_tokenizer), dict(expected))
    assert_batches_equal(own_padding, dict(expected))


@pytest.mark.hf
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("options", PADDING_CASES)
@pytest.mark.parametrize("fields", ["input_ids", "with attention_mask", "all token fields"])
def test_plain_token_lists_are_padded_without_tokenizer_pad_exactly_as_it_would(
    hf_tokenizer, monkeypatch, side, options, fields
):
    hf_tokenizer.padding_side = side
    try:
        extra = {
            "input_ids": {},
            "with attention_mask": {"return_attention_mask": True},
            "all token fields": {"return_token_type_ids": True, "return_special_tokens_mask": True},
        }[fields]
        features = [
            {key: list(value) for key, value in feature.items()}
            for feature in encode(hf_tokenizer, SENTENCES[:3] + ["cat"], **extra)
        ]
        if fields == "input_ids":
            features = [{"input_ids": feature["input_ids"]} for feature in features]
        expected = hf_tokenizer.pad(
            features,
            return_tensors="pt",
            padding=options.get("padding", True),
            max_length=options.get("max_length"),
            pad_to_multiple_of=options.get("pad_to_multiple_of"),
        )
        calls = []
        monkeypatch.setattr(hf_tokenizer, "pad", lambda *args, **kwargs: calls.append(args), raising=False)
        padded = pad_batch(
            hf_tokenizer,
            features,
            options.get("padding", True),
            options.get("max_length"),
            options.get("pad_to_multiple_of"),
        )
    finally:
        monkeypatch.undo()
        hf_tokenizer.padding_side = "right"
    assert calls == []  # lathe padded them itself
    assert_batches_equal(padded, dict(expected))
    assert all(padded[key].dtype == expected[key].dtype for key in expected)


def test_items_that_are_not_plain_token_lists_still_go_to_tokenizer_pad():
    calls = []

    class Padder(MiniTokenizer):
        model_input_names = ["input_ids", "attention_mask"]

        def pad(self, features, **kwargs):
            calls.append([sorted(feature) for feature in features])
            return {"input_ids": torch.zeros(len(features), 1, dtype=torch.long)}

    tokenizer = Padder()
    pad_batch(tokenizer, [{"input_ids": [1]}, {"input_ids": [1, 2]}])
    assert calls == []
    pad_batch(tokenizer, [{"input_ids": [1], "labels": 0}, {"input_ids": [1, 2], "labels": 1}])  # another field
    pad_batch(tokenizer, [{"input_ids": torch.tensor([1])}, {"input_ids": torch.tensor([1, 2])}])  # tensors
    assert calls == [[["input_ids", "labels"], ["input_ids", "labels"]], [["input_ids"], ["input_ids"]]]


def test_seq2seq_pads_labels_with_label_pad_token_id():
    features = [{"input_ids": [5, 6], "labels": [7]}, {"input_ids": [8], "labels": [9, 10, 11]}]
    right = DataCollatorForSeq2Seq(MiniTokenizer())(features)
    assert_batches_equal(
        right,
        {
            "input_ids": t([[5, 6], [8, 0]]),
            "attention_mask": t([[1, 1], [1, 0]]),
            "labels": t([[7, -100, -100], [9, 10, 11]]),
        },
    )
    left = DataCollatorForSeq2Seq(MiniTokenizer("left"), pad_to_multiple_of=4, label_pad_token_id=-1)(features)
    assert_batches_equal(
        left,
        {
            "input_ids": t([[0, 0, 5, 6], [0, 0, 0, 8]]),
            "attention_mask": t([[0, 0, 1, 1], [0, 0, 0, 1]]),
            "labels": t([[-1, -1, -1, 7], [-1, 9, 10, 11]]),
        },
    )
    fixed = DataCollatorForSeq2Seq(MiniTokenizer(), padding="max_length", max_length=4)(features)
    assert torch.equal(fixed["labels"], t([[7, -100, -100, -100], [9, 10, 11, -100]]))
    assert fixed["input_ids"].shape == (2, 4)


def test_seq2seq_without_labels_and_with_model():
    no_labels = DataCollatorForSeq2Seq(MiniTokenizer())([{"input_ids": [5], "labels": None}] * 2)
    assert no_labels["labels"] is None  # transformers keeps the key with None

    class ShiftingModel:
        def prepare_decoder_input_ids_from_labels(self, labels):
            start = torch.full((labels.shape[0], 1), EOS)
            return torch.cat([start, labels[:, :-1].masked_fill(labels[:, :-1] == -100, PAD)], dim=1)

    features = [{"input_ids": [5], "label": [7, 8]}, {"input_ids": [6], "label": [9]}]
    batch = DataCollatorForSeq2Seq(MiniTokenizer(), model=ShiftingModel())(features)
    assert torch.equal(batch["labels"], t([[7, 8], [9, -100]]))
    assert torch.equal(batch["decoder_input_ids"], t([[EOS, 7], [EOS, 9]]))
    with pytest.raises(ValueError, match="return_tensors must be 'pt'.*or 'np'"):
        DataCollatorForSeq2Seq(MiniTokenizer())(features, return_tensors="tf")


@pytest.mark.hf
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("options", PADDING_CASES + [dict(label_pad_token_id=-1, pad_to_multiple_of=4)])
def test_seq2seq_matches_transformers(hf_tokenizer, hf_collators, side, options):
    hf_tokenizer.padding_side = side
    try:
        features = encode(hf_tokenizer, SENTENCES)
        for feature, target in zip(features, reversed(SENTENCES)):
            feature["labels"] = hf_tokenizer(target[: 4 + len(feature["input_ids"])])["input_ids"]
        expected = hf_collators.DataCollatorForSeq2Seq(hf_tokenizer, **options)(features)
        through_tokenizer = DataCollatorForSeq2Seq(hf_tokenizer, **options)(features)
        own_padding = DataCollatorForSeq2Seq(without_pad_method(hf_tokenizer), **options)(features)
    finally:
        hf_tokenizer.padding_side = "right"
    assert_batches_equal(dict(through_tokenizer), dict(expected))
    assert_batches_equal(own_padding, dict(expected))


# ---------------------------------------------------------------------------- language modeling


def test_causal_lm_labels_hide_padding():
    features = [{"input_ids": [5, 6, EOS]}, {"input_ids": [7]}]
    right = DataCollatorForLanguageModeling(MiniTokenizer(), mlm=False)(features)
    assert_batches_equal(
        right,
        {
            "input_ids": t([[5, 6, EOS], [7, 0, 0]]),
            "attention_mask": t([[1, 1, 1], [1, 0, 0]]),
            "labels": t([[5, 6, EOS], [7, -100, -100]]),
        },
    )
    bare = DataCollatorForLanguageModeling(MiniTokenizer("left"), mlm=False, pad_to_multiple_of=4)([[5, 6], [7]])
    assert_batches_equal(
        bare, {"input_ids": t([[0, 0, 5, 6], [0, 0, 0, 7]]), "labels": t([[-100, -100, 5, 6], [-100, -100, -100, 7]])}
    )
    # equal lengths are stacked without needing a pad token
    stacked = DataCollatorForLanguageModeling(MiniTokenizer(pad_token_id=None), mlm=False)([torch.tensor([5, 6])] * 2)
    assert_batches_equal(stacked, {"input_ids": t([[5, 6], [5, 6]]), "labels": t([[5, 6], [5, 6]])})
    with pytest.raises(ValueError, match=r"tokenizer\.pad_token"):
        DataCollatorForLanguageModeling(MiniTokenizer(pad_token_id=None), mlm=False)([[5, 6], [7]])


def test_mlm_masks_only_ordinary_tokens():
    tokenizer = MiniTokenizer()
    features = [[EOS, 5, 6, 7, UNK], [8, 9]]
    all_masked = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=1.0, mask_replace_prob=1.0, random_replace_prob=0.0
    )(features)
    assert_batches_equal(
        all_masked,
        {
            "input_ids": t([[EOS, MASK, MASK, MASK, UNK], [MASK, MASK, PAD, PAD, PAD]]),
            "labels": t([[-100, 5, 6, 7, -100], [8, 9, -100, -100, -100]]),
        },
    )
    kept = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=1.0, mask_replace_prob=0.0, random_replace_prob=0.0
    )
    batch = kept([{"input_ids": [5, 6, 7], "special_tokens_mask": [0, 1, 0]}])
    assert_batches_equal(
        batch, {"input_ids": t([[5, 6, 7]]), "attention_mask": t([[1, 1, 1]]), "labels": t([[5, -100, 7]])}
    )


def test_mlm_probabilities_follow_the_80_10_10_rule():
    tokenizer = MiniTokenizer()
    inputs = torch.randint(4, 20, (64, 128), generator=torch.Generator().manual_seed(0))
    batch = DataCollatorForLanguageModeling(tokenizer, seed=1)(list(inputs))
    targets = batch["labels"] != -100
    assert abs(targets.float().mean().item() - 0.15) < 0.02
    assert torch.equal(batch["labels"][targets], inputs[targets])
    as_mask = (batch["input_ids"] == MASK) & targets
    unchanged = (batch["input_ids"] == inputs) & targets
    assert abs(as_mask.sum().item() / targets.sum().item() - 0.8) < 0.04
    # unchanged = the 10% kept + random draws that hit the original token (1 in 20)
    assert abs(unchanged.sum().item() / targets.sum().item() - (0.1 + 0.1 / 20)) < 0.03
    assert torch.equal(batch["input_ids"][~targets], inputs[~targets])


def test_mlm_seed_is_reproducible_and_per_worker(monkeypatch):
    features = [list(range(4, 20))] * 4
    first = DataCollatorForLanguageModeling(MiniTokenizer(), seed=7)
    second = DataCollatorForLanguageModeling(MiniTokenizer(), seed=7)
    batch_a, batch_b = first(features), second(features)
    assert_batches_equal(batch_a, batch_b)
    assert not torch.equal(first(features)["labels"], batch_a["labels"])  # the generator advances
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: types.SimpleNamespace(id=1))
    in_worker = DataCollatorForLanguageModeling(MiniTokenizer(), seed=6)(features)
    assert_batches_equal(in_worker, batch_a)  # worker 1 of seed 6 draws like seed 7


def test_whole_word_masking_masks_all_pieces_of_a_word():
    # "[EOS] playing ball [EOS]" split as play|ing ball: offsets tie "play" and "ing" together
    item = {
        "input_ids": [EOS, 5, 6, 7, EOS],
        "special_tokens_mask": [1, 0, 0, 0, 1],
        "offset_mapping": [[0, 0], [0, 4], [4, 7], [8, 12], [0, 0]],
    }
    with pytest.warns(UserWarning, match="mask_replace_prob=1"):
        collator = DataCollatorForLanguageModeling(MiniTokenizer(), whole_word_mask=True, mlm_probability=0.5, seed=0)
    for _ in range(10):
        labels = collator([item] * 8)["labels"]
        assert torch.equal(labels[:, 1] == -100, labels[:, 2] == -100)
        assert (labels[:, [0, 4]] == -100).all()
    with pytest.raises(ValueError, match="offset_mapping"):
        collator([{"input_ids": [5, 6]}])


def test_language_modeling_errors():
    with pytest.raises(ValueError, match="mask token"):
        DataCollatorForLanguageModeling(MiniTokenizer(mask_token_id=None))
    assert DataCollatorForLanguageModeling(MiniTokenizer(mask_token_id=None), mlm=False).mlm is False
    with pytest.raises(ValueError, match="mlm_probability"):
        DataCollatorForLanguageModeling(MiniTokenizer(), mlm_probability=1.5)
    with pytest.raises(ValueError, match="must not exceed 1"):
        DataCollatorForLanguageModeling(MiniTokenizer(), mask_replace_prob=0.8, random_replace_prob=0.3)
    with pytest.raises(ValueError, match="return_tensors must be 'pt'.*or 'np'"):
        DataCollatorForLanguageModeling(MiniTokenizer(), return_tensors="tf")
    no_vocabulary = types.SimpleNamespace(pad_token_id=PAD, mask_token_id=MASK)
    with pytest.raises(ValueError, match="vocab_size"):
        DataCollatorForLanguageModeling(no_vocabulary)
    DataCollatorForLanguageModeling(no_vocabulary, random_replace_prob=0.0)
    with pytest.raises(ValueError, match="return_tensors must be 'pt'.*or 'np'"):
        DataCollatorForLanguageModeling(MiniTokenizer())([[5, 6]], return_tensors="tf")


@pytest.mark.hf
@pytest.mark.parametrize(
    "options",
    [
        dict(mlm=False),
        dict(mlm=False, pad_to_multiple_of=8),
        dict(seed=3),
        dict(seed=5, mlm_probability=0.5, mask_replace_prob=0.5, random_replace_prob=0.3, pad_to_multiple_of=8),
        dict(seed=11, mlm_probability=0.4, mask_replace_prob=0.0, random_replace_prob=1.0),
    ],
)
def test_language_modeling_matches_transformers(hf_tokenizer, hf_collators, options):
    """lathe draws its random numbers in transformers' order, so with the same seed the batches are
    identical, not merely alike."""
    with_special = encode(hf_tokenizer, SENTENCES * 4, return_special_tokens_mask=True)
    plain = [feature["input_ids"] + [EOS] for feature in with_special]
    for features in (with_special, plain):
        expected = hf_collators.DataCollatorForLanguageModeling(hf_tokenizer, **options)
        actual = DataCollatorForLanguageModeling(hf_tokenizer, **options)
        for _ in range(2):  # the second batch checks the generators advanced alike
            assert_batches_equal(dict(actual(features)), dict(expected(features)))
    own_padding = DataCollatorForLanguageModeling(without_pad_method(hf_tokenizer), mlm=False)
    expected = hf_collators.DataCollatorForLanguageModeling(hf_tokenizer, mlm=False)
    assert_batches_equal(own_padding(encode(hf_tokenizer, SENTENCES)), dict(expected(encode(hf_tokenizer, SENTENCES))))


@pytest.mark.hf
def test_whole_word_masking_matches_transformers(hf_tokenizer, hf_collators):
    item = {
        "input_ids": [EOS, 5, 6, 7, 8, 9, EOS],
        "special_tokens_mask": [1, 0, 0, 0, 0, 0, 1],
        "offset_mapping": [[0, 0], [0, 4], [4, 7], [8, 12], [13, 15], [15, 16], [0, 0]],
    }
    options = dict(whole_word_mask=True, mlm_probability=0.5, seed=2)
    with pytest.warns(UserWarning):
        expected = hf_collators.DataCollatorForLanguageModeling(hf_tokenizer, **options)
    with pytest.warns(UserWarning):
        actual = DataCollatorForLanguageModeling(hf_tokenizer, **options)
    for _ in range(3):
        assert_batches_equal(dict(actual([item] * 6)), dict(expected([item] * 6)))


# ---------------------------------------------------------------------------- flattening


def test_flattening_packs_one_row():
    features = [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]}, {"input_ids": torch.tensor([8, 9])}]
    batch = DataCollatorWithFlattening()(features)
    assert_batches_equal(
        batch,
        {
            "input_ids": t([[5, 6, 7, 8, 9]]),
            "labels": t([[-100, 6, 7, -100, 9]]),
            "position_ids": t([[0, 1, 2, 0, 1]]),
        },
    )
    with_labels = [{"input_ids": [5, 6], "labels": [-100, 6]}, {"input_ids": [8, 9, 10], "labels": [8, -100, 10]}]
    collator = DataCollatorWithFlattening(
        return_position_ids=False, return_flash_attn_kwargs=True, return_seq_idx=True, position_ids_start=2
    )
    assert_batches_equal(
        collator(with_labels, separator_id=-1),
        {
            "input_ids": t([[5, 6, 8, 9, 10]]),
            "labels": t([[-1, 6, -1, -100, 10]]),
            "seq_idx": t([[0, 0, 1, 1, 1]], torch.int32),
            "cu_seq_lens_q": t([0, 2, 5], torch.int32),
            "cu_seq_lens_k": t([0, 2, 5], torch.int32),
            "max_length_q": 3,
            "max_length_k": 3,
        },
    )
    assert DataCollatorWithFlattening(position_ids_start=2)(with_labels)["position_ids"].tolist() == [[2, 3, 2, 3, 4]]
    with pytest.raises(ValueError, match="return_tensors must be 'pt'.*or 'np'"):
        DataCollatorWithFlattening()(features, return_tensors="tf")


@pytest.mark.hf
@pytest.mark.parametrize(
    "options",
    [dict(), dict(return_flash_attn_kwargs=True, return_seq_idx=True), dict(return_position_ids=False, separator_id=7)],
)
def test_flattening_matches_transformers(hf_tokenizer, hf_collators, options):
    features = encode(hf_tokenizer, SENTENCES)
    labelled = [dict(feature, labels=feature["input_ids"][::-1]) for feature in features]
    for batch in (features, labelled):
        expected = hf_collators.DataCollatorWithFlattening(**options)(batch)
        assert_batches_equal(DataCollatorWithFlattening(**options)(batch), expected)
