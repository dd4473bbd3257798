"""Preference data: ranking entries in dataset_info.json, the canonical two-answer rows (alpaca, sharegpt,
KTO tags) as LLaMA-Factory lays them out, broken pairs skipped and reported by row, and which stage may
read which kind of data."""

import numpy as np
import pytest

from lathe.llm.data.conversion import convert_example
from lathe.llm.data.registry import get_dataset_list, parse_entry
from tests.llm.golden.make_llamafactory_preference import DATA_DIR

RANKING_ALPACA = {
    "file_name": "x.json",
    "ranking": True,
    "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"},
}
RANKING_SHAREGPT = {
    "file_name": "x.json",
    "ranking": True,
    "formatting": "sharegpt",
    "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"},
}
KTO_SHAREGPT = {
    "file_name": "x.json",
    "formatting": "sharegpt",
    "columns": {"messages": "messages", "kto_tag": "label"},
    "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
}


def convert(entry: dict, row: dict) -> dict:
    return convert_example(row, parse_entry("d", entry, "dataset_info.json"), require_response=False)


def test_ranking_rows_become_chosen_then_rejected():
    row = convert(
        RANKING_ALPACA, {"instruction": "Reverse abc.", "input": "One word.", "chosen": "cba", "rejected": "abc"}
    )
    assert row["_problem"] == ""
    assert row["_prompt"] == [{"role": "user", "content": "Reverse abc.\nOne word."}]
    assert row["_response"] == [{"role": "assistant", "content": "cba"}, {"role": "assistant", "content": "abc"}]
    row = convert(
        RANKING_SHAREGPT,
        {
            "conversations": [
                {"from": "human", "value": "hi"},
                {"from": "gpt", "value": "hello"},
                {"from": "human", "value": "2+2?"},
            ],
            "chosen": {"from": "gpt", "value": "4"},
            "rejected": {"from": "gpt", "value": "5"},
        },
    )
    assert [message["content"] for message in row["_prompt"]] == ["hi", "hello", "2+2?"]
    assert row["_response"] == [{"role": "assistant", "content": "4"}, {"role": "assistant", "content": "5"}]


def test_kto_rows_put_the_answer_on_its_side():
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    good = convert(KTO_SHAREGPT, {"messages": messages, "label": True})
    bad = convert(KTO_SHAREGPT, {"messages": messages, "label": False})
    assert good["_response"] == [{"role": "assistant", "content": "4"}, {"role": "assistant", "content": ""}]
    assert bad["_response"] == [{"role": "assistant", "content": ""}, {"role": "assistant", "content": "4"}]


@pytest.mark.parametrize(
    "entry, row, problem",
    [
        (
            RANKING_ALPACA,
            {"instruction": "q", "chosen": "a"},
            "missing answer\tcolumn 'rejected' (rejected) is missing",
        ),
        (
            RANKING_ALPACA,
            {"instruction": "q", "chosen": "", "rejected": "b"},
            "empty answer\tcolumn 'chosen' (chosen) is empty",
        ),
        (RANKING_ALPACA, {"instruction": "q", "chosen": "a", "rejected": "a"}, "identical answers\t"),
        (
            RANKING_ALPACA,
            {"instruction": "q", "chosen": 3, "rejected": "a"},
            "wrong type\tcolumn 'chosen' (chosen) is int",
        ),
        (
            RANKING_SHAREGPT,
            {
                "conversations": [{"from": "human", "value": "q"}],
                "chosen": {"from": "human", "value": "a"},
                "rejected": {"from": "gpt", "value": "b"},
            },
            "wrong role\tcolumn 'chosen' (chosen) has from 'human'",
        ),
        (
            RANKING_SHAREGPT,
            {
                "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
                "chosen": {"from": "gpt", "value": "a"},
                "rejected": {"from": "gpt", "value": "b"},
            },
            "even number of turns\tthe conversation ends with a assistant turn",
        ),
        (
            KTO_SHAREGPT,
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "label": "yes"},
            "missing kto_tag\tcolumn 'label' (kto_tag) is string, expected true",
        ),
        (
            KTO_SHAREGPT,
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}], "label": True},
            "empty answer\t",
        ),
    ],
)
def test_broken_rows_say_what_is_wrong(entry, row, problem):
    assert convert(entry, row)["_problem"].startswith(problem)


def test_broken_pairs_are_skipped_and_reported_with_their_row(caplog):
    from lathe.llm.data.loader import load_converted_dataset

    class Arguments:
        dataset_dir, max_samples, preprocessing_num_workers, overwrite_cache = str(DATA_DIR), None, None, True

    dataset, report = load_converted_dataset(
        get_dataset_list("pairs_bad", str(DATA_DIR))[0], Arguments(), False, np.random.RandomState(0)
    )
    assert len(dataset) == 1 and report.skipped == 4
    assert dict(report.reasons) == {"missing answer": 1, "empty answer": 1, "identical answers": 1, "wrong type": 1}
    assert report.examples[0] == f"{DATA_DIR / 'pairs_bad.json'} row 2: column 'rejected' (rejected) is missing"


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"file_name": "x.json", "ranking": True, "columns": {"prompt": "q", "chosen": "c"}},
            "needs the rejected column",
        ),
        (
            {"file_name": "x.json", "columns": {"prompt": "q", "chosen": "c", "rejected": "r"}},
            'is not marked "ranking": true',
        ),
        ({**RANKING_ALPACA, "columns": {**RANKING_ALPACA["columns"], "kto_tag": "t"}}, "'kto_tag' marks KTO data"),
        ({"file_name": "x.json", "ranking": "yes"}, r"\(key 'ranking'\): must be true or false, got 'yes'"),
    ],
)
def test_registry_errors(entry, message):
    with pytest.raises(ValueError, match=message):
        parse_entry("d", entry, "dataset_info.json")


@pytest.mark.parametrize(
    "stage, dataset, message",
    [
        ("sft", "pairs_alpaca", "ranking data is for stage rm or dpo, not stage sft"),
        ("dpo", "plain_alpaca", "stage dpo trains on ranking data"),
        ("kto", "plain_alpaca", "stage kto needs a 'kto_tag' column"),
        ("sft", "feedback", "data with a 'kto_tag' column is for stage kto, not stage sft"),
        ("rm", "feedback", "stage rm trains on ranking data"),
    ],
)
def test_each_stage_reads_its_own_kind_of_data(stage, dataset, message):
    from lathe.llm.data.loader import load_datasets

    with pytest.raises(ValueError, match=message):
        load_datasets(get_dataset_list(dataset, str(DATA_DIR)), None, stage, np.random.RandomState(0))


def test_token_counts_include_both_sides_of_a_pair():
    import datasets

    from lathe.llm.data.preview import trained_fraction

    rows = datasets.Dataset.from_dict(
        {
            "chosen_input_ids": [[1, 2, 3]],
            "chosen_labels": [[-100, 2, 3]],
            "rejected_input_ids": [[1, 2, 4, 5]],
            "rejected_labels": [[-100, 2, 4, 5]],
        }
    )
    assert trained_fraction(rows) == (5, 7)
