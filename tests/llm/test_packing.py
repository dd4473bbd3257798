"""Packed sft rows (lathe.llm.data.packing) and the sft collator (lathe.llm.data.collator).

The proof that packing changes nothing but speed: for a tiny LlamaForCausalLM (fp32, CPU), a packed batch
gives the same per-token loss, the same logits at every real position and, through the Trainer, the same
gradients as the same examples padded one per row; with transformers 5.23's eager and sdpa attention, and
for both ways of keeping packed examples apart (a 4-D block-diagonal mask; position_ids in one flattened
row). The layout is compared with LLaMA-Factory 0.9.5's packed rows
(tests/llm/golden/llamafactory_packing.json, made by make_llamafactory_packing.py).
"""

import json
import os
import random
from collections import Counter
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lathe.llm.config.train import DataArguments  # noqa: E402
from lathe.llm.data.collator import SFTDataCollator, block_diagonal_mask  # noqa: E402
from lathe.llm.data.packing import greedy_knapsack, pack_examples, preprocess_packed_supervised_dataset  # noqa: E402
from lathe.llm.data.supervised import encode_supervised_examples  # noqa: E402
from lathe.llm.templates.resolve import get_template_and_fix_tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORDS = "hello what two plus four add sum name a b result is ok be brief first second".split()
CUTOFF = 64


def conversations(count=12, seed=0):
    rng = random.Random(seed)

    def text():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))

    rows = []
    for _ in range(count):
        messages = []
        for _ in range(rng.choice([1, 1, 2])):
            messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        rows.append({"_prompt": messages[:-1], "_response": messages[-1:], "_system": "", "_tools": ""})
    return {key: [row[key] for row in rows] for key in rows[0]}


def setup_examples(tokenizer, train_on_prompt=False, neat_packing=False, count=12, template="chatml"):
    data_args = DataArguments(
        template=template, cutoff_len=CUTOFF, train_on_prompt=train_on_prompt, neat_packing=neat_packing, packing=True
    )
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    examples = conversations(count)
    encoded, skipped = encode_supervised_examples(examples, template, tokenizer, data_args)
    assert not skipped
    return examples, template, data_args, encoded


def rows_of(columns: dict) -> list[dict]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def segments(row: dict) -> list[tuple[int, int]]:
    """(start, end) of each packed example, from position_ids restarting at 0."""
    starts = [index for index, position in enumerate(row["position_ids"]) if position == 0]
    return list(zip(starts, starts[1:] + [len(row["position_ids"])]))


# ---------------------------------------------------------------- the packing layout


def test_greedy_knapsack_by_hand():
    # sorted 2 3 5 7 8: bin 1 takes 8 then 2; bin 2 takes 7 then 3; bin 3 takes 5
    assert greedy_knapsack([5, 3, 8, 2, 7], 10) == [[2, 3], [4, 1], [0]]
    assert greedy_knapsack([4, 4, 4], 8) == [[2, 1], [0]]  # equal lengths: the last seen goes first
    assert greedy_knapsack([], 8) == []
    with pytest.raises(ValueError, match="does not fit"):
        greedy_knapsack([3, 9], 8)


@pytest.mark.parametrize("neat_packing", [False, True])
def test_packed_rows_hold_every_example_once_unsplit(word_tokenizer, neat_packing):
    examples, template, data_args, encoded = setup_examples(word_tokenizer, neat_packing=neat_packing, count=30)
    packed = preprocess_packed_supervised_dataset(examples, template, word_tokenizer, data_args)
    assert packed == preprocess_packed_supervised_dataset(
        examples, template, word_tokenizer, data_args
    )  # deterministic
    assert sorted(packed) == ["attention_mask", "input_ids", "labels", "position_ids"]
    assert len(packed["input_ids"]) < len(encoded)  # something was packed
    found = Counter()
    for row in rows_of(packed):
        assert len(row["input_ids"]) <= CUTOFF
        assert all(len(row[key]) == len(row["input_ids"]) for key in row)
        for number, (start, end) in enumerate(segments(row), start=1):
            ids, labels = row["input_ids"][start:end], row["labels"][start:end]
            assert row["position_ids"][start:end] == list(range(end - start))
            assert row["attention_mask"][start:end] == [number if neat_packing else 1] * (end - start)
            original = next(pair for pair in encoded if pair[0] == ids and pair[1][1:] == labels[1:])
            assert labels == [-100] + original[1][1:]
            found[(tuple(ids), tuple(labels))] += 1
    expected = Counter((tuple(ids), tuple([-100] + labels[1:])) for ids, labels in encoded)
    assert found == expected  # every example exactly once


def test_first_label_of_each_packed_example_is_never_trained(word_tokenizer):
    examples, template, data_args, encoded = setup_examples(word_tokenizer, train_on_prompt=True)
    assert all(labels[0] != -100 for _, labels in encoded)  # trained unpacked too, but never predicted there
    packed = pack_examples(encoded, CUTOFF)
    for row in rows_of(packed):
        assert all(row["labels"][start] == -100 for start, _ in segments(row))


@pytest.fixture(scope="module")
def lf_golden():
    with open(os.path.join(HERE, "golden", "llamafactory_packing.json"), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.mark.parametrize("case_index", [0, 1, 2])
def test_same_rows_as_llamafactory_but_the_boundary_labels(lf_golden, case_index):
    """LLaMA-Factory 0.9.5 packs into cutoff_len - 1 and pads to cutoff_len; lathe, given that
    capacity, makes the same rows without the padding, and -100 on each example's first label."""
    from transformers import AutoTokenizer

    from tests.llm.golden.make_llamafactory_packing import conversations as golden_conversations

    case = lf_golden["cases"][case_index]
    assert lf_golden["conversations"] == golden_conversations()
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(HERE, "golden", "tokenizers", lf_golden["tokenizer"]))
    data_args = DataArguments(
        template=lf_golden["template"],
        cutoff_len=case["packed_cutoff_len"],
        packing=True,
        neat_packing=case["neat_packing"],
        train_on_prompt=case["train_on_prompt"],
    )
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    rows = lf_golden["conversations"]
    examples = {key: [row[key] for row in rows] for key in rows[0]}
    packed = preprocess_packed_supervised_dataset(examples, template, tokenizer, data_args)
    assert len(packed["input_ids"]) == len(case["input_ids"])
    changed_labels = 0
    for index, row in enumerate(rows_of(packed)):
        size = len(row["input_ids"])
        theirs = {key: case[key][index] for key in ("input_ids", "attention_mask", "position_ids", "labels")}
        assert row["input_ids"] == theirs["input_ids"][:size]
        assert row["position_ids"] == theirs["position_ids"][:size]
        assert row["attention_mask"] == theirs["attention_mask"][:size]
        assert theirs["input_ids"][size:] == [case["pad_token_id"]] * (case["packed_cutoff_len"] + 1 - size)
        assert set(theirs["labels"][size:]) == {-100}
        for position, (mine, their) in enumerate(zip(row["labels"], theirs["labels"])):
            if row["position_ids"][position] == 0:
                assert mine == -100
                changed_labels += their != -100
            else:
                assert mine == their
    # plain masking: every example starts with a prompt token, untrained either way; train_on_prompt: not so
    assert (changed_labels > 0) == case["train_on_prompt"]


# ---------------------------------------------------------------- the collator


class PaddingTokenizer:
    pad_token_id = 0

    def __init__(self, side="right"):
        self.padding_side = side


def test_unpacked_rows_are_padded_on_the_padding_side():
    features = [
        {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [-100, 6, 7]},
        {"input_ids": [8], "attention_mask": [1], "labels": [8]},
    ]
    batch = SFTDataCollator(PaddingTokenizer(), pad_to_multiple_of=4)(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100], [8, -100, -100, -100]]
    batch = SFTDataCollator(PaddingTokenizer("left"))(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [-100, -100, 8]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]


def test_generation_rows_pad_labels_to_their_own_length():
    """predict_with_generate rows: the prompt as input_ids, the reference answer as labels."""
    features = [{"input_ids": [5, 6, 7], "labels": [9]}, {"input_ids": [8], "labels": [3, 4]}]
    batch = SFTDataCollator(PaddingTokenizer("left"), label_pad_token_id=0)(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch["labels"].tolist() == [[0, 9], [3, 4]]


def test_block_diagonal_mask_by_hand():
    # two examples (2 and 3 tokens), then two padding positions: a segment of their own
    mask = block_diagonal_mask(torch.tensor([[0, 1, 0, 1, 2, 0, 1]]), "sdpa")
    assert mask.shape == (1, 1, 7, 7) and mask.dtype == torch.bool
    assert mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0, 0],
        [0, 0, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1, 1],
    ]
    additive = block_diagonal_mask(torch.tensor([[0, 1, 0, 1, 2, 0, 1]]), "eager", torch.bfloat16)
    assert additive.dtype == torch.bfloat16
    assert torch.equal(additive == 0, mask) and set(additive.unique().tolist()) == {
        0.0,
        torch.finfo(torch.bfloat16).min,
    }


def stub_model(implementation, dtype=torch.float32):
    model = torch.nn.Linear(1, 1).to(dtype)
    model.config = SimpleNamespace(_attn_implementation=implementation)
    return model


@pytest.mark.parametrize(
    "implementation, dtype, kind",
    [
        ("sdpa", torch.float32, torch.bool),
        ("eager", torch.float32, torch.float32),
        ("eager", torch.float16, torch.float16),
        (None, torch.float32, torch.float32),
        ("flash_attention_2", torch.bfloat16, None),
        ("flex_attention", torch.float32, None),
    ],
)
def test_auto_picks_how_packed_examples_are_kept_apart(implementation, dtype, kind):
    features = [
        {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "position_ids": [0, 1, 0], "labels": [-100, 6, -100]},
        {"input_ids": [8, 9], "attention_mask": [1, 1], "position_ids": [0, 1], "labels": [-100, 9]},
    ]
    batch = SFTDataCollator(PaddingTokenizer(), model=stub_model(implementation, dtype), pad_to_multiple_of=4)(features)
    if kind is None:  # flash kernels / flex: one flattened row, boundaries in position_ids, no mask
        assert "attention_mask" not in batch
        assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
        assert batch["position_ids"].tolist() == [[0, 1, 0, 0, 1, 0, 1, 2]]
        assert batch["labels"].tolist() == [[-100, 6, -100, -100, 9, -100, -100, -100]]
    else:
        assert batch["attention_mask"].shape == (2, 1, 4, 4) and batch["attention_mask"].dtype == kind
        assert batch["position_ids"].tolist() == [[0, 1, 0, 0], [0, 1, 0, 1]]
        assert batch["labels"].tolist() == [[-100, 6, -100, -100], [-100, 9, -100, -100]]


def test_unknown_packed_attention_mode_is_refused():
    with pytest.raises(ValueError, match="packed_attention must be one of"):
        SFTDataCollator(PaddingTokenizer(), packed_attention="varlen")


# ---------------------------------------------------------------- packed = unpacked


def tiny_llama(vocab_size, implementation, use_cache=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        use_cache=use_cache,
        tie_word_embeddings=False,
    )
    config._attn_implementation = implementation
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float()


def token_losses(model, batch):
    """Sum of the token losses and the number of label tokens (labels shifted as the model does)."""
    logits = model(**batch).logits[..., :-1, :]
    labels = batch["labels"][..., 1:]
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
    return total, int(labels.ne(-100).sum())


def example_logits(model, batch, packed: bool):
    """The logits of every example at its real positions, in order of the examples found."""
    logits = model(**batch).logits
    found = {}
    for row in range(batch["input_ids"].shape[0]):
        if packed:
            positions = batch["position_ids"][row].tolist()
            starts = [index for index, value in enumerate(positions) if value == 0]
            spans = zip(starts, starts[1:] + [len(positions)])
        else:
            spans = [(0, int(batch["attention_mask"][row].sum()))]
        for start, end in spans:
            key = tuple(batch["input_ids"][row, start:end].tolist())
            found.setdefault(key, logits[row, start:end])
    return found


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["mask", "position_ids"])
@pytest.mark.parametrize("train_on_prompt", [False, True])
def test_packed_loss_and_logits_equal_unpacked(word_tokenizer, implementation, mode, train_on_prompt):
    _, _, _, encoded = setup_examples(word_tokenizer, train_on_prompt=train_on_prompt)
    model = tiny_llama(len(word_tokenizer), implementation).eval()
    collator = SFTDataCollator(word_tokenizer, model=model, pad_to_multiple_of=8, packed_attention=mode)
    unpacked = collator(
        [{"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels} for ids, labels in encoded]
    )
    packed_rows = rows_of(pack_examples(encoded, CUTOFF))
    packed = collator(packed_rows)
    assert len(packed_rows) < len(encoded)
    with torch.no_grad():
        packed_sum, packed_count = token_losses(model, packed)
        unpacked_sum, unpacked_count = token_losses(model, unpacked)
        assert packed_count == unpacked_count > 0
        assert abs(packed_sum.item() / packed_count - unpacked_sum.item() / unpacked_count) < 1e-5
        # the model's own loss, normalised by num_items_in_batch as the Trainer does
        packed_loss = model(**packed, num_items_in_batch=torch.tensor(packed_count)).loss
        unpacked_loss = model(**unpacked, num_items_in_batch=torch.tensor(unpacked_count)).loss
        assert abs(packed_loss.item() - unpacked_loss.item()) < 1e-5
        mine, reference = example_logits(model, packed, packed=True), example_logits(model, unpacked, packed=False)
    assert set(reference) <= set(mine)
    for key, logits in reference.items():
        torch.testing.assert_close(mine[key], logits, rtol=0, atol=1e-5)


def test_without_isolation_or_the_boundary_label_the_losses_differ(word_tokenizer):
    """The two things the equality needs, shown by removing each (a check that the test can fail)."""
    _, _, _, encoded = setup_examples(word_tokenizer, train_on_prompt=True)
    model = tiny_llama(len(word_tokenizer), "sdpa").eval()
    collator = SFTDataCollator(word_tokenizer, model=model)
    unpacked = collator([{"input_ids": ids, "labels": labels} for ids, labels in encoded])
    packed = collator(rows_of(pack_examples(encoded, CUTOFF)))
    with torch.no_grad():
        reference_sum, reference_count = token_losses(model, unpacked)
        reference = reference_sum.item() / reference_count
        crossing = dict(packed, attention_mask=torch.ones_like(packed["input_ids"]))  # examples see each other
        total, count = token_losses(model, crossing)
        assert abs(total.item() / count - reference) > 1e-3
        # LLaMA-Factory's labels: each example's first label predicted from the previous example's last token
        lf_labels = packed["labels"].clone()
        for row, members in enumerate(greedy_knapsack([len(ids) for ids, _ in encoded], CUTOFF)):
            start = 0
            for index in members:
                lf_labels[row, start] = encoded[index][1][0]
                start += len(encoded[index][0])
        total, count = token_losses(model, dict(packed, labels=lf_labels))
        assert count > reference_count and abs(total.item() / count - reference) > 1e-4


def test_position_ids_alone_do_not_isolate_when_the_model_makes_a_cache(word_tokenizer):
    """Why the collator builds the mask itself for eager/sdpa: transformers 5.23 infers packed
    boundaries from position_ids only without a KV cache; config.use_cache=True (the default) makes one
    even in training. The mask path does not depend on it."""
    _, _, _, encoded = setup_examples(word_tokenizer)
    model = tiny_llama(len(word_tokenizer), "sdpa", use_cache=True).train()
    unpacked = SFTDataCollator(word_tokenizer, model=model)(
        [{"input_ids": ids, "labels": labels} for ids, labels in encoded]
    )
    with torch.no_grad():
        reference_sum, reference_count = token_losses(model, unpacked)
        for mode, isolated in (("mask", True), ("position_ids", False)):
            batch = SFTDataCollator(word_tokenizer, model=model, packed_attention=mode)(
                rows_of(pack_examples(encoded, CUTOFF))
            )
            total, count = token_losses(model, batch)
            assert (abs(total.item() / count - reference_sum.item() / reference_count) < 1e-5) == isolated


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_one_trainer_step_packed_equals_unpacked(word_tokenizer, tmp_path, implementation):
    """One update over the same 12 examples, packed (rows of 64) or one per row: the Trainer normalises by
    num_items_in_batch over the accumulation window, so the gradients are the same."""
    from lathe.train import Trainer, TrainerCallback, TrainingArguments

    _, _, _, encoded = setup_examples(word_tokenizer)
    unpacked_rows = [{"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels} for ids, labels in encoded]
    packed_rows = rows_of(pack_examples(encoded, CUTOFF))

    class GradientRecorder(TrainerCallback):
        def __init__(self):
            self.gradients = None

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            self.gradients = {name: parameter.grad.detach().clone() for name, parameter in model.named_parameters()}

    def one_step(rows, batch_size, accumulation):
        model = tiny_llama(len(word_tokenizer), implementation)
        recorder = GradientRecorder()
        args = TrainingArguments(
            output_dir=str(tmp_path / f"run{batch_size}"),
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            max_steps=1,
            learning_rate=0.1,
            optim="sgd",
            lr_scheduler_type="constant",
            max_grad_norm=0,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            seed=3,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=rows,
            callbacks=[recorder],
            data_collator=SFTDataCollator(word_tokenizer, model=model, pad_to_multiple_of=8),
        )
        result = trainer.train()
        return recorder.gradients, result.training_loss

    assert len(unpacked_rows) == 12 and len(packed_rows) < 12
    unpacked_gradients, unpacked_loss = one_step(unpacked_rows, batch_size=3, accumulation=4)
    packed_gradients, packed_loss = one_step(packed_rows, batch_size=1, accumulation=len(packed_rows))
    assert abs(packed_loss - unpacked_loss) < 1e-5
    for name, gradient in unpacked_gradients.items():
        torch.testing.assert_close(packed_gradients[name], gradient, rtol=1e-5, atol=1e-5, msg=name)
