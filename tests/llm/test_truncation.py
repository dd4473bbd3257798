"""What cutoff_len cuts is reported (lathe.llm.data.truncation): per example, per split in the cache
manifest (a cached run reports the same), in the log (loud when most trained tokens are gone) and in the
printed plan; the tokenizer's misleading "indexing errors" warning is gone; pre-training cuts nothing."""

import json
import logging
import math
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from lathe.llm.config.train import DataArguments  # noqa: E402
from lathe.llm.data.pipeline import get_dataset  # noqa: E402
from lathe.llm.data.supervised import IGNORE_INDEX, encode_supervised_example  # noqa: E402
from lathe.llm.templates.resolve import get_template_and_fix_tokenizer  # noqa: E402

WORDS = "what is two plus four add sum name result first second content".split()


def conversation(turns: int, words: int, offset: int = 0):
    messages = []
    for turn in range(turns):
        for role in ("user", "assistant"):
            text = " ".join(WORDS[(offset + turn + i) % len(WORDS)] for i in range(words))
            messages.append({"role": role, "content": text})
    return messages


def trained(labels):
    return sum(label != IGNORE_INDEX for label in labels)


@pytest.mark.parametrize(
    "template_name, flags",
    [
        ("qwen", {}),
        ("qwen", {"mask_history": True}),
        ("qwen", {"train_on_prompt": True}),
        ("llama2", {}),  # efficient_eos: EOS labels on later prompts and one EOS at the end
    ],
)
@pytest.mark.parametrize("cutoff_len", [7, 20, 45, 1000])
def test_an_example_s_cut_is_its_whole_encoding_less_what_was_kept(word_tokenizer, template_name, flags, cutoff_len):
    from lathe.llm.data.supervised import measure_supervised_example

    template = get_template_and_fix_tokenizer(word_tokenizer, DataArguments(template=template_name))
    messages = conversation(turns=3, words=6)
    args = (messages[:-1], messages[-1:], "", "", template, word_tokenizer)
    input_ids, labels, cut = measure_supervised_example(*args, cutoff_len, **flags)
    assert (input_ids, labels) == encode_supervised_example(*args, cutoff_len, **flags)  # the rows are unchanged
    whole_ids, whole_labels = encode_supervised_example(*args, 10**9, **flags)
    assert (cut.tokens_before, cut.tokens_after) == (len(whole_ids), len(input_ids))
    assert (cut.labels_before, cut.labels_after) == (trained(whole_labels), trained(labels))
    assert cut.truncated == (len(whole_ids) > cutoff_len)
    assert len(input_ids) <= max(cutoff_len, 1 if template.efficient_eos else 0)


def write_data(folder, rows):
    (folder / "d.json").write_text(json.dumps(rows), encoding="utf-8")
    (folder / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.json"}}), encoding="utf-8")


def build(folder, tokenizer, generate=False, stage="sft", **values):
    data_args = DataArguments(dataset_dir=str(folder), **{"template": "qwen", **values})
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    return get_dataset(
        template,
        SimpleNamespace(),
        data_args,
        SimpleNamespace(seed=1, predict_with_generate=generate),
        stage,
        tokenizer,
        cache_dir=str(folder / "cache"),
    )


LONG = [{"instruction": "what is two plus two", "output": " ".join(["four"] * (40 + i))} for i in range(6)]
SHORT = [{"instruction": "add", "output": "four"} for _ in range(4)]


def expected_counts(tokenizer, rows, cutoff_len):
    """The split's counts worked out example by example, from the whole encodings."""
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="qwen"))
    counts = dict.fromkeys(
        ("examples", "truncated_examples", "cut_tokens", "label_tokens", "cut_label_tokens", "longest_example"), 0
    )
    for row in rows:
        prompt, answer = (
            [{"role": "user", "content": row["instruction"]}],
            [{"role": "assistant", "content": row["output"]}],
        )
        whole_ids, whole_labels = encode_supervised_example(prompt, answer, "", "", template, tokenizer, 10**9)
        ids, labels = encode_supervised_example(prompt, answer, "", "", template, tokenizer, cutoff_len)
        counts["examples"] += 1
        counts["truncated_examples"] += len(whole_ids) > cutoff_len
        counts["cut_tokens"] += len(whole_ids) - len(ids)
        counts["label_tokens"] += trained(whole_labels)
        counts["cut_label_tokens"] += trained(whole_labels) - trained(labels)
        counts["longest_example"] = max(counts["longest_example"], len(whole_ids))
    return counts


@pytest.mark.parametrize("packing", [False, True])
def test_a_split_whose_every_example_is_cut_is_counted_and_warned_loudly(tmp_path, word_tokenizer, caplog, packing):
    write_data(tmp_path, LONG)
    with caplog.at_level("INFO", logger="lathe.llm.data"):
        module = build(
            tmp_path, word_tokenizer, dataset="d", cutoff_len=16, packing=packing, max_dropped_rows_share=1.0
        )
    counts = expected_counts(word_tokenizer, LONG, 16)
    assert counts["truncated_examples"] == 6 and counts["cut_label_tokens"] > counts["label_tokens"] / 2
    assert module["truncation"]["train"] == {**counts, "rows_before": 6}  # rows_before: the examples before tokenizing
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert any(
        message.startswith("MOST TOKENS THAT SHOULD TRAIN ARE CUT. train split: cutoff_len 16 cut 6 of 6 examples")
        and f"cutoff_len: {counts['longest_example']} keeps every example whole" in message
        for message in warnings
    )
    assert set(module["train_dataset"].column_names) <= {"input_ids", "attention_mask", "labels", "position_ids"}

    caplog.clear()
    with caplog.at_level("INFO", logger="lathe.llm.data"):
        cached = build(
            tmp_path, word_tokenizer, dataset="d", cutoff_len=16, packing=packing, max_dropped_rows_share=1.0
        )
    assert "loaded from the cache" in caplog.text
    assert cached["truncation"] == module["truncation"]
    assert "MOST TOKENS THAT SHOULD TRAIN ARE CUT" in caplog.text
    assert cached["train_dataset"].column_names == module["train_dataset"].column_names


def test_a_few_cut_examples_are_reported_quietly_and_none_cut_reports_nothing(tmp_path, word_tokenizer, caplog):
    write_data(tmp_path, SHORT * 5 + LONG[:1])
    with caplog.at_level("INFO", logger="lathe.llm.data"):
        module = build(tmp_path, word_tokenizer, dataset="d", cutoff_len=40, val_size=0.25)
    stats = module["truncation"]["train"]
    assert stats["truncated_examples"] <= 1 and stats["examples"] == len(module["train_dataset"])
    assert "MOST TOKENS" not in caplog.text
    assert module["truncation"]["validation"]["examples"] == len(module["eval_dataset"])


def test_generation_eval_rows_count_the_reference_tokens_cut(tmp_path, word_tokenizer):
    write_data(tmp_path, LONG)
    module = build(tmp_path, word_tokenizer, eval_dataset="d", cutoff_len=16, generate=True)
    stats = module["truncation"]["validation"]
    assert stats["truncated_examples"] == 6
    assert stats["label_tokens"] - stats["cut_label_tokens"] == sum(
        len(row["labels"]) for row in module["eval_dataset"]
    )


def test_the_tokenizers_indexing_errors_warning_is_not_shown(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir, model_max_length=16)
    write_data(tmp_path, [{"instruction": "what", "output": "two plus two " * 80_000}])  # about 1 MB
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)
    try:
        module = build(tmp_path, tokenizer, dataset="d", cutoff_len=16, max_dropped_rows_share=1.0)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [message for message in seen if "indexing errors" in message]
    assert module["truncation"]["train"]["truncated_examples"] == 1
    assert tokenizer.deprecation_warnings.get("sequence-length-is-longer-than-the-specified-maximum", False) is False


def test_pretraining_cuts_nothing(tmp_path, word_tokenizer):
    (tmp_path / "d.txt").write_text("two plus two is four " * 30 + "\nfirst second\n", encoding="utf-8")
    (tmp_path / "dataset_info.json").write_text(
        json.dumps({"d": {"file_name": "d.txt", "columns": {"prompt": "text"}}})
    )
    module = build(tmp_path, word_tokenizer, dataset="d", cutoff_len=8, stage="pt", template=None)
    assert module["truncation"] == {"train": None}
    assert sum(len(row) for row in module["train_dataset"]["input_ids"]) == 30 * 5 + 2 + 2  # every token and 2 EOS


def test_the_plan_shows_what_cutoff_len_cut(tmp_path):
    import torch

    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.plan import format_plan, make_plan

    datasets = pytest.importorskip("datasets")
    train = datasets.Dataset.from_dict({"input_ids": [[5] * 16] * 6, "labels": [[-100] * 6 + [5] * 10] * 6})
    config = parse_train_config(
        {
            "model_name_or_path": "m",
            "dataset": "d",
            "finetuning_type": "full",
            "output_dir": str(tmp_path),
            "cutoff_len": 16,
            "report_to": "none",
        }
    )
    stats = {
        "examples": 6,
        "truncated_examples": 6,
        "cut_tokens": 300,
        "label_tokens": 320,
        "cut_label_tokens": 260,
        "longest_example": 66,
    }
    model = torch.nn.Linear(2, 2)
    text = format_plan(make_plan(config, {"train_dataset": train, "truncation": {"train": stats}}, model), config)
    assert (
        "  truncation      cutoff_len 16 cut 6 of 6 examples (longest 66 tokens): 300 tokens, of them 260 of 320 "
        "trained tokens (81.2%) -- MOST OF THE TRAINING SIGNAL IS LOST: RAISE CUTOFF_LEN (CUTOFF_LEN: 66 KEEPS"
    ) in text
    quiet = {**stats, "truncated_examples": 0, "cut_tokens": 0, "cut_label_tokens": 0, "longest_example": 16}
    text = format_plan(make_plan(config, {"train_dataset": train, "truncation": {"train": quiet}}, model), config)
    assert "  truncation      no example is longer than cutoff_len 16 (longest 16 tokens)" in text
    config.finetuning.stage = "pt"
    text = format_plan(make_plan(config, {"train_dataset": train, "truncation": {"train": None}}, model), config)
    assert "  cutoff_len      16-token rows; no token is cut (a longer document continues in the next row)" in text


def test_a_cutoff_that_cuts_most_trained_tokens_stops_in_one_line_unless_allowed(tmp_path, word_tokenizer):
    """No row is left out (every answer keeps a few tokens), yet most of the signal is gone: the run stops with
    the share and the longest example, and max_dropped_rows_share (the rows guard's key) lets it through."""
    write_data(tmp_path, LONG)
    counts = expected_counts(word_tokenizer, LONG, 16)
    share = counts["cut_label_tokens"] / counts["label_tokens"]
    assert counts["examples"] == 6 and share > 0.5
    with pytest.raises(ValueError) as error:
        build(tmp_path, word_tokenizer, dataset="d", cutoff_len=16)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"cutoff_len=16 cuts {share:.1%} of the trained tokens of the training data")
    assert f"longest example {counts['longest_example']} tokens" in message
    assert f"max_dropped_rows_share: {math.ceil(share * 100) / 100} (now 0.1)" in message
    with pytest.raises(ValueError, match="cuts"):  # a share below the cut one is not enough
        build(tmp_path, word_tokenizer, dataset="d", cutoff_len=16, max_dropped_rows_share=round(share - 0.02, 2))
    module = build(
        tmp_path, word_tokenizer, dataset="d", cutoff_len=16, max_dropped_rows_share=math.ceil(share * 100) / 100
    )
    assert len(module["train_dataset"]) == 6
