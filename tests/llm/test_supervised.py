"""Supervised preprocessing: which tokens are trained (hand-written goldens per template), train_on_prompt,
mask_history, efficient_eos, truncation worked out by hand, counted skips, and equality with
LLaMA-Factory 0.9.5's SupervisedDatasetProcessor / UnsupervisedDatasetProcessor token for token (golden
file made by tests/llm/golden/make_llamafactory_golden.py with LLaMA-Factory 0.9.5, transformers 5.6)."""

import gzip
import json
import logging
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from lathe.llm.data.supervised import (  # noqa: E402
    IGNORE_INDEX,
    SkippedExample,
    encode_supervised_example,
    infer_seqlen,
    preprocess_supervised_dataset,
)
from lathe.llm.data.unsupervised import preprocess_unsupervised_dataset  # noqa: E402
from lathe.llm.templates import TEMPLATES, Template, get_template_and_fix_tokenizer  # noqa: E402
from lathe.llm.templates import tool_calls as tool_formats  # noqa: E402
from tests.llm.chat_goldens import GOLDEN_EFFICIENT_EOS, LLAMA3_DATE, SPECS, messages_of, spec_ids  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"


def data_args(template, **overrides):
    fields = dict(
        template=template,
        cutoff_len=1024,
        train_on_prompt=False,
        mask_history=False,
        tool_format=None,
        default_system=None,
        enable_thinking=True,
        preserve_thinking=False,
    )
    return SimpleNamespace(**{**fields, **overrides})


@pytest.fixture(autouse=True)
def pinned_llama3_date(monkeypatch):
    monkeypatch.setattr(tool_formats, "today", lambda: LLAMA3_DATE)


def encode(tokenizer, template, conversation, cutoff_len=1024, **flags):
    system, tools, messages = messages_of(conversation) if isinstance(conversation, str) else conversation
    return encode_supervised_example(
        messages[:-1], messages[-1:], system, tools, template, tokenizer, cutoff_len, **flags
    )


def expected_rows(tokenizer, spec):
    """« » spans are masked, everything else is trained (see chat_goldens)."""
    input_ids, labels = [], []
    for prompt, answer in spec_ids(tokenizer, spec):
        input_ids += prompt + answer
        labels += [IGNORE_INDEX] * len(prompt) + answer
    return input_ids, labels


def chat(*turns, system=""):
    roles = ["user", "assistant"] * len(turns)
    return system, "", [{"role": role, "content": text} for role, text in zip(roles, turns)]


HI_TWO = chat("hi", "hello", "two plus two ?", "four")
TURN1 = "<|im_start|> user ↵ hi <|im_end|> ↵ <|im_start|> assistant ↵"
TURN2 = "<|im_start|> user ↵ two plus two ? <|im_end|> ↵ <|im_start|> assistant ↵"


@pytest.mark.parametrize("conversation", ["single", "system_multi", "tools"])
@pytest.mark.parametrize("name", list(SPECS))
def test_labels_mask_every_prompt_span_and_train_every_answer_with_eos(word_tokenizer, name, conversation):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args(name))
    assert encode(word_tokenizer, template, conversation) == expected_rows(word_tokenizer, SPECS[name][conversation])


def test_train_on_prompt_trains_everything(word_tokenizer):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("chatml"))
    input_ids, labels = encode(word_tokenizer, template, "system_multi", train_on_prompt=True)
    assert labels == input_ids


def test_mask_history_trains_the_last_answer_only(word_tokenizer):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("chatml"))
    rows = encode(word_tokenizer, template, HI_TWO, mask_history=True)
    assert rows == expected_rows(word_tokenizer, f"« {TURN1} hello <|im_end|> ↵ {TURN2} » four <|im_end|> ↵")


@pytest.mark.parametrize(
    "source,target,cutoff,expected",
    [
        (10, 3, 8, (5, 3)),  # short answer: kept whole, the prompt is cut
        (3, 10, 8, (3, 5)),  # short prompt: kept whole, the answer is cut
        (10, 10, 8, (4, 4)),  # both long: cut in proportion
        (10, 30, 8, (2, 6)),
        (14, 30, 22, (8, 14)),  # 22 * (30 / 44) is 14.999... in floating point: LLaMA-Factory gets 14, so do we
        (5, 5, 100, (5, 5)),
    ],
)
def test_infer_seqlen(source, target, cutoff, expected):
    assert infer_seqlen(source, target, cutoff) == expected


@pytest.mark.parametrize(
    "cutoff_len,mask_history,spec",
    [
        # turn 1 (9 prompt + 3 answer tokens) fits; turn 2 gets the 8 left: its 3-token answer is short, so
        # it is kept and the prompt is cut to 5 tokens (from the right, as LLaMA-Factory does)
        (20, False, f"« {TURN1} » hello <|im_end|> ↵ « <|im_start|> user ↵ two plus » four <|im_end|> ↵"),
        (12, False, f"« {TURN1} » hello <|im_end|> ↵"),  # turn 1 spends the budget: turn 2 is left out
        # last turn first: it takes 15; turn 1 gets 5: both of its parts are over half, so
        # 5 * 3 / 12 -> 1 answer token (masked: history) and 4 prompt tokens
        (20, True, f"« <|im_start|> user ↵ hi hello {TURN2} » four <|im_end|> ↵"),
    ],
)
def test_multiturn_truncation_worked_by_hand(word_tokenizer, cutoff_len, mask_history, spec):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("chatml"))
    rows = encode(word_tokenizer, template, HI_TWO, cutoff_len=cutoff_len, mask_history=mask_history)
    assert rows == expected_rows(word_tokenizer, spec)
    assert len(rows[0]) <= cutoff_len


@pytest.mark.parametrize(
    "cutoff_len,spec",
    [
        # 12-token answer, 9-token prompt, 8 budget: both over half -> int(8 * 12 / 21) = 4 answer tokens
        (8, "« <|im_start|> user ↵ hi » four four four four"),
        # 12-token answer, 9-token prompt, 16 budget: both over half -> int(16 * 12 / 21) = 9 answer tokens
        (16, "« <|im_start|> user ↵ hi <|im_end|> ↵ <|im_start|> » " + "four " * 9),
        # 20 budget: the prompt is under half, kept whole; the answer gets the other 11 tokens
        (20, f"« {TURN1} » " + "four " * 10 + "<|im_end|>"),
    ],
)
def test_single_turn_truncation_worked_by_hand(word_tokenizer, cutoff_len, spec):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("chatml"))
    rows = encode(word_tokenizer, template, chat("hi", " ".join(["four"] * 10)), cutoff_len=cutoff_len)
    assert rows == expected_rows(word_tokenizer, spec)


def test_efficient_eos_trains_eos_on_the_next_prompts_first_token(word_tokenizer):
    template = Template(
        name="eff", user=("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n",), efficient_eos=True
    )
    assert template.assistant == ("{{content}}",)  # no EOS in the answer slots
    input_ids, labels = encode(word_tokenizer, template, HI_TWO)
    eos = word_tokenizer.eos_token_id
    expected_ids, expected_labels = expected_rows(word_tokenizer, f"« {TURN1} » hello « {TURN2} » four")
    assert input_ids == expected_ids + [eos]
    second_prompt = expected_labels.index(IGNORE_INDEX, 10)  # where turn 2's prompt starts
    expected_labels[second_prompt] = eos  # EOS is what follows "hello": trained at that position
    assert labels == expected_labels + [eos]
    # the final EOS is counted in the budget: 10 = 8 prompt tokens (of 9) + "hello" + EOS
    short_ids, short_labels = encode(word_tokenizer, template, chat("hi", "hello"), cutoff_len=10)
    hello = word_tokenizer.convert_tokens_to_ids("hello")
    assert short_ids == expected_ids[:8] + [hello, eos] and short_labels == [IGNORE_INDEX] * 8 + [hello, eos]


def test_reasoning_template_adds_an_empty_thought(word_tokenizer):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("qwen3"))
    rows = encode(word_tokenizer, template, chat("hi", "hello"))
    thought = "<think> ↵ ↵ </think> ↵ ↵"
    assert rows == expected_rows(word_tokenizer, f"« {TURN1} » {thought} hello <|im_end|> ↵")
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("qwen3", enable_thinking=False))
    rows = encode(word_tokenizer, template, chat("hi", "hello"))  # not thinking: the thought is prompt
    assert rows == expected_rows(word_tokenizer, f"« {TURN1} {thought} » hello <|im_end|> ↵")


def test_invalid_examples_are_skipped_and_counted(word_tokenizer, caplog):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("chatml"))
    user, answer = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
    bad_call = {"role": "function", "content": "{not json"}
    rows = [
        ([user], [answer]),  # kept
        ([user, answer], [answer]),  # even prompt
        ([user], []),  # no answer
        ([answer], [answer]),  # roles do not alternate
        ([user], [{"role": "assistant", "content": None}]),  # content not a string
        ([user, bad_call, {"role": "observation", "content": "4"}], [answer]),  # tool call not JSON
        ([{"role": "user", "content": "hi " * 40}], [answer]),  # nothing trained left at cutoff_len 6
    ]
    examples = {
        "_prompt": [p for p, _ in rows],
        "_response": [r for _, r in rows],
        "_system": [""] * len(rows),
        "_tools": [""] * len(rows),
    }
    skipped = Counter()
    with caplog.at_level(logging.WARNING, logger="lathe.llm.data"):
        out = preprocess_supervised_dataset(
            examples, template, word_tokenizer, data_args("chatml", cutoff_len=6), skipped=skipped
        )
    # the row cutoff_len leaves with no trained token is kept, as LLaMA-Factory keeps it
    assert len(out["input_ids"]) == 2 and out["attention_mask"] == [[1] * len(ids) for ids in out["input_ids"]]
    assert sum(skipped.values()) == 5 and len(skipped) == 5
    assert "skipped 5 of 7 examples" in caplog.text
    assert "kept 1 of 7 examples with no trained token left after truncation to cutoff_len=6" in caplog.text
    assert any("not valid JSON" in reason for reason in skipped)
    assert all(label == -100 for label in out["labels"][1]) or all(label == -100 for label in out["labels"][0])
    with pytest.raises(SkippedExample):
        encode_supervised_example([user, bad_call, user], [answer], "", "", template, word_tokenizer, 99)


def test_unsupervised_rows_are_prompt_and_reference(word_tokenizer):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("chatml"))
    system, tools, messages = HI_TWO
    examples = {
        "_prompt": [messages[:-1], messages[:1]],
        "_response": [messages[-1:], []],
        "_system": [system] * 2,
        "_tools": [tools] * 2,
    }
    out = preprocess_unsupervised_dataset(examples, template, word_tokenizer, data_args("chatml"))
    spec = f"« {TURN1} » hello <|im_end|> ↵ « {TURN2} » four <|im_end|> ↵"
    (prompt1, answer1), (prompt2, answer2) = spec_ids(word_tokenizer, spec)
    prompt, answer = prompt1 + answer1 + prompt2, answer2
    assert out["input_ids"][0] == prompt and out["labels"][0] == answer
    empty_answer = word_tokenizer.convert_tokens_to_ids(["<|im_end|>", "\n"])
    assert out["labels"][1] == empty_answer  # no reference: an empty answer


@pytest.fixture
def golden_cases(monkeypatch):
    monkeypatch.setitem(TEMPLATES, GOLDEN_EFFICIENT_EOS.name, GOLDEN_EFFICIENT_EOS)
    golden = json.loads(gzip.decompress((GOLDEN_DIR / "llamafactory_golden.json.gz").read_bytes()))
    return golden["meta"], golden["cases"]


def test_efficient_eos_with_mask_history_keeps_llamafactorys_turn_order_rule(word_tokenizer):
    # Turns are processed last-first, and every turn but the first processed (the last one) gets the EOS
    # label on its prompt's first token: position 0 (never predicted) and the EOS after the first history
    # answer are labelled, the EOS after the second history answer is not. LLaMA-Factory does exactly this.
    conversation = chat("hi", "hello", "two plus two ?", "four", "hi", "four")
    input_ids, labels = encode(word_tokenizer, GOLDEN_EFFICIENT_EOS, conversation, mask_history=True)
    eos = word_tokenizer.eos_token_id
    trained = [(position, token) for position, token in enumerate(labels) if token != IGNORE_INDEX]
    four = word_tokenizer.convert_tokens_to_ids("four")
    assert trained == [(0, eos), (10, eos), (len(labels) - 2, four), (len(labels) - 1, eos)]


def test_supervised_rows_equal_llamafactory_token_for_token(golden_cases):
    """Every golden case (templates x conversations x train_on_prompt / mask_history / truncation /
    tool_format / default_system / thinking flags, word-level and byte-level BPE tokenizers, and
    templates parsed from a tokenizer's chat_template) gives LLaMA-Factory's exact input_ids and labels,
    except where lathe deliberately differs: an example LLaMA-Factory aborts on (tool-call JSON that
    does not parse) is skipped and counted here."""
    from transformers import AutoTokenizer

    meta, cases = golden_cases
    assert meta["llamafactory"] == "0.9.5"
    outcomes = Counter()
    for case in cases:
        expected = case["llamafactory"]
        tokenizer = AutoTokenizer.from_pretrained(str(GOLDEN_DIR / "tokenizers" / case["tokenizer"]))
        args = data_args(case["template"], **case["args"])
        if expected.get("error", "").startswith("ValueError"):  # a refused configuration
            with pytest.raises(ValueError):
                get_template_and_fix_tokenizer(tokenizer, args)
            outcomes["configuration refused"] += 1
            continue
        template = get_template_and_fix_tokenizer(tokenizer, args)
        example = {key: [value] for key, value in meta["conversations"][case["conversation"]].items()}
        skipped = Counter()
        out = preprocess_supervised_dataset(example, template, tokenizer, args, skipped=skipped)
        where = (case["id"], case["tokenizer"], case["template"], case["conversation"], case["args"])
        if "error" in expected:
            assert not out["input_ids"] and "not valid JSON" in next(iter(skipped)), where
            outcomes["LLaMA-Factory error: skipped"] += 1
        else:  # rows left with no trained token included: kept, as LLaMA-Factory keeps them
            assert out["input_ids"] == [expected["input_ids"]] and out["labels"] == [expected["labels"]], where
            outcomes["equal"] += 1
        if "unsupervised" in expected:
            out = preprocess_unsupervised_dataset(example, template, tokenizer, args)
            assert [out["input_ids"][0], out["labels"][0]] == expected["unsupervised"], where
            outcomes["unsupervised equal"] += 1
    assert outcomes["equal"] > 380 and outcomes["unsupervised equal"] > 380, outcomes
