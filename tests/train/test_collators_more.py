"""NumPy output of every collator, and the token-classification, multiple-choice and permutation-LM
collators: exact batches, compared with transformers' where it is installed (`hf`)."""

from __future__ import annotations

import copy
import types

import numpy as np
import pytest
import torch

from lathe.data_collator import (
    DataCollatorForLanguageModeling,
    DataCollatorForMultipleChoice,
    DataCollatorForPermutationLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    default_data_collator,
    to_numpy,
)

PAD, CLS, SEP, MASK = 0, 1, 2, 3


class Tokenizer:
    """Enough of a tokenizer for the collators: pad/mask ids, side, special tokens."""

    model_input_names = ["input_ids", "attention_mask"]
    model_max_length = 512

    def __init__(self, padding_side="right"):
        self.padding_side = padding_side
        self.pad_token_id, self.mask_token_id = PAD, MASK
        self.pad_token, self.mask_token = "[PAD]", "[MASK]"

    def __len__(self):
        return 30

    def get_special_tokens_mask(self, ids, already_has_special_tokens=False):
        return [1 if token in (CLS, SEP) else 0 for token in ids]


@pytest.fixture(scope="module")
def bert_tokenizer(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("".join(f"{token}\n" for token in ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", *"abcdefgh"]))
    return transformers.BertTokenizer(str(vocab))


def test_numpy_default_collator_dtypes():
    batch = default_data_collator([{"input_ids": [1, 2], "label": i} for i in range(3)], return_tensors="np")
    assert batch["labels"].dtype == np.int64 and batch["labels"].tolist() == [0, 1, 2]
    assert isinstance(batch["input_ids"], np.ndarray) and batch["input_ids"].shape == (3, 2)
    batch = default_data_collator([{"x": [0.5, 1.0], "label": 0.5}] * 2, return_tensors="np")
    assert batch["labels"].dtype == np.float32 and batch["x"].dtype == np.float64  # as transformers: np.array's own
    pairs = [(torch.tensor([1.0, 2.0]), torch.tensor(0)), (torch.tensor([3.0, 4.0]), torch.tensor(1))]
    inputs, targets = default_data_collator(pairs, return_tensors="np")
    assert inputs.tolist() == [[1.0, 2.0], [3.0, 4.0]] and targets.tolist() == [0, 1]


def test_padding_collators_give_the_same_numbers_as_arrays():
    features = [{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8], "labels": [8]}]
    for collator in (
        DataCollatorWithPadding(Tokenizer()),
        DataCollatorForSeq2Seq(Tokenizer()),
        DataCollatorForTokenClassification(Tokenizer()),
        DataCollatorForLanguageModeling(Tokenizer(), mlm=False),
    ):
        inputs = copy.deepcopy(features)
        if isinstance(collator, (DataCollatorWithPadding, DataCollatorForLanguageModeling)):
            inputs = [{"input_ids": item["input_ids"]} for item in inputs]
        torch_batch = collator(copy.deepcopy(inputs))
        collator.return_tensors = "np"
        numpy_batch = collator(inputs)
        assert inputs == (features if "labels" in inputs[0] else inputs)  # the items are not changed
        assert sorted(numpy_batch) == sorted(torch_batch)
        for key, value in torch_batch.items():
            assert isinstance(numpy_batch[key], np.ndarray), (type(collator).__name__, key)
            assert numpy_batch[key].dtype == to_numpy(value).dtype
            assert numpy_batch[key].tolist() == value.tolist()


def test_flattening_numpy_output():
    features = [{"input_ids": [10, 11, 12]}, {"input_ids": [20, 21]}]
    batch = DataCollatorWithFlattening(return_tensors="np", return_flash_attn_kwargs=True)(features)
    assert batch["input_ids"].tolist() == [[10, 11, 12, 20, 21]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["cu_seq_lens_q"].dtype == np.int32 and batch["cu_seq_lens_q"].tolist() == [0, 3, 5]
    assert batch["max_length_k"] == 3


def test_unknown_return_tensors_is_an_error():
    with pytest.raises(ValueError, match="'tf' not recognized"):
        DataCollatorForTokenClassification(Tokenizer())([{"input_ids": [1]}], return_tensors="tf")


@pytest.mark.parametrize("side", ["right", "left"])
def test_token_classification_pads_labels_on_the_padding_side(side):
    features = [{"input_ids": [5, 6, 7], "labels": [1, 2, 3]}, {"input_ids": torch.tensor([8]), "labels": [4]}]
    batch = DataCollatorForTokenClassification(Tokenizer(side), pad_to_multiple_of=4)(features)
    pads = {"right": [[1, 2, 3, -100], [4, -100, -100, -100]], "left": [[-100, 1, 2, 3], [-100, -100, -100, 4]]}
    assert batch["labels"].tolist() == pads[side] and batch["labels"].dtype == torch.int64
    assert batch["input_ids"].shape == (2, 4)
    no_labels = DataCollatorForTokenClassification(Tokenizer())([{"input_ids": [5]}, {"input_ids": [6, 7]}])
    assert "labels" not in no_labels
    kept_name = DataCollatorForTokenClassification(Tokenizer(), label_pad_token_id=-1)(
        [{"input_ids": [5], "label": [1]}, {"input_ids": [6, 7], "label": [1, 2]}]
    )
    assert kept_name["label"].tolist() == [[1, -1], [1, 2]]  # transformers keeps the field's name


def test_multiple_choice_pads_every_choice_to_one_length():
    features = [
        {"input_ids": [[5, 6], [7]], "label": 1},
        {"input_ids": [[8], [9, 10, 11]], "label": 0},
    ]
    batch = DataCollatorForMultipleChoice(Tokenizer())(features)
    assert batch["input_ids"].tolist() == [[[5, 6, 0], [7, 0, 0]], [[8, 0, 0], [9, 10, 11]]]
    assert batch["attention_mask"][1].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert batch["labels"].tolist() == [1, 0] and batch["labels"].dtype == torch.int64
    assert DataCollatorForMultipleChoice(Tokenizer(), return_tensors="np")(features)["input_ids"].shape == (2, 2, 3)
    with pytest.raises(ValueError, match="same number of choices"):
        DataCollatorForMultipleChoice(Tokenizer())([features[0], {"input_ids": [[1]], "label": 0}])


def test_permutation_lm_masks_spans_and_never_lets_a_masked_token_see_itself():
    torch.manual_seed(0)
    rows = [[CLS, *range(4, 32), SEP], [CLS, *range(4, 20), SEP]]
    batch = DataCollatorForPermutationLanguageModeling(Tokenizer())([{"input_ids": row} for row in rows])
    assert batch["input_ids"].shape == (2, 30) and batch["perm_mask"].shape == (2, 30, 30)
    masked = batch["labels"] != -100
    assert masked.any()
    assert (batch["input_ids"][masked] == MASK).all()
    special = torch.tensor([[token in (CLS, SEP, PAD) for token in row + [PAD] * (30 - len(row))] for row in rows])
    assert not (masked & special).any()  # special tokens and padding are never targets
    diagonal = batch["perm_mask"].diagonal(dim1=1, dim2=2)
    assert torch.equal(diagonal.bool(), masked)  # a masked token cannot attend to itself
    assert torch.equal(batch["target_mapping"], torch.eye(30).expand(2, 30, 30))
    with pytest.raises(ValueError, match="even sequence length"):
        DataCollatorForPermutationLanguageModeling(Tokenizer())([{"input_ids": [4, 5, 6]}])
    with pytest.raises(ValueError, match="mask token"):
        no_mask = types.SimpleNamespace(pad_token_id=PAD, padding_side="right", mask_token_id=None)
        DataCollatorForPermutationLanguageModeling(no_mask)([[4, 5]])


# ---------------------------------------------------------------------------- the same batches as transformers


@pytest.mark.hf
def test_token_classification_and_multiple_choice_equal_transformers(bert_tokenizer):
    from transformers import data as hf_data

    hf = hf_data.data_collator
    features = [{"input_ids": [1, 5, 6, 2], "labels": [0, 1, 1, 0]}, {"input_ids": [1, 7, 2], "labels": [0, 2, 0]}]
    for return_tensors in ("pt", "np"):
        for side in ("right", "left"):
            bert_tokenizer.padding_side = side
            kwargs = {"pad_to_multiple_of": 8, "label_pad_token_id": -7, "return_tensors": return_tensors}
            ours = DataCollatorForTokenClassification(bert_tokenizer, **kwargs)(copy.deepcopy(features))
            theirs = hf.DataCollatorForTokenClassification(bert_tokenizer, **kwargs)(copy.deepcopy(features))
            assert {key: to_numpy(value).tolist() for key, value in ours.items()} == {
                key: to_numpy(value).tolist() for key, value in theirs.items()
            }
    bert_tokenizer.padding_side = "right"
    choices = [{"input_ids": [[1, 5, 2], [1, 6, 7, 8, 2]], "label": 1}, {"input_ids": [[1, 2], [1, 5, 2]], "label": 0}]
    ours = DataCollatorForMultipleChoice(bert_tokenizer)(copy.deepcopy(choices))
    theirs = hf.DataCollatorForMultipleChoice(bert_tokenizer)(copy.deepcopy(choices))
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.hf
def test_permutation_lm_equals_transformers_for_the_same_seed(bert_tokenizer):
    from transformers import data as hf_data

    rows = [{"input_ids": [1, *range(5, 11), 2]}, {"input_ids": [1, 5, 6, 2]}]
    torch.manual_seed(7)
    ours = DataCollatorForPermutationLanguageModeling(bert_tokenizer, max_span_length=3)(copy.deepcopy(rows))
    torch.manual_seed(7)
    theirs = hf_data.data_collator.DataCollatorForPermutationLanguageModeling(bert_tokenizer, max_span_length=3)(
        copy.deepcopy(rows)
    )
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.hf
def test_numpy_batches_equal_transformers(bert_tokenizer):
    from transformers import data as hf_data

    hf = hf_data.data_collator
    features = [{"input_ids": [1, 5, 6, 2], "labels": [1, 5, 6, 2]}, {"input_ids": [1, 7, 2], "labels": [1, 7, 2]}]
    inputs_only = [{"input_ids": item["input_ids"]} for item in features]
    pairs = [
        (
            DataCollatorForSeq2Seq(bert_tokenizer, return_tensors="np"),
            hf.DataCollatorForSeq2Seq(bert_tokenizer, return_tensors="np"),
        ),
        (
            DataCollatorForLanguageModeling(bert_tokenizer, mlm=False, return_tensors="np"),
            hf.DataCollatorForLanguageModeling(bert_tokenizer, mlm=False, return_tensors="np"),
        ),
    ]
    for ours, theirs in pairs:
        items = features if isinstance(ours, DataCollatorForSeq2Seq) else inputs_only
        mine, reference = ours(copy.deepcopy(items)), theirs(copy.deepcopy(items))
        assert sorted(mine) == sorted(reference)
        for key in reference:
            assert mine[key].dtype == reference[key].dtype and mine[key].tolist() == reference[key].tolist(), key
    for labels in ([0, 1], [0.5, 1.5]):
        items = [{"input_ids": [1, 2], "label": label} for label in labels]
        mine, reference = default_data_collator(items, "np"), hf.default_data_collator(items, "np")
        for key in reference:
            assert mine[key].dtype == reference[key].dtype and mine[key].tolist() == reference[key].tolist(), key
