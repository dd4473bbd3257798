"""Loading registered datasets: every format x file type to exact canonical rows, folders, num_samples,
max_samples, mixing, the val_size split and eval datasets (lathe.llm.data.loader)."""

import json
import os

import numpy as np
import pytest

from lathe.llm.config.train import DataArguments
from lathe.llm.data.loader import load_datasets, merge_datasets, sample_rows, split_validation
from lathe.llm.data.registry import get_dataset_list

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def row(prompt, response, system="", tools=""):
    return {"_prompt": prompt, "_response": response, "_system": system, "_tools": tools}


ALPACA = [
    row([user("Add 2 and 3.")], [assistant("5")]),
    row([user("Reverse the word.\nlathe")], [assistant("ehtal")], system="You are terse."),
    row(
        [user("What is 1 plus 1?"), assistant("2"), user("And 2 plus 2?"), assistant("4"), user("And now 4 plus 4?")],
        [assistant("8")],
    ),
]
# The csv file has instruction/input/output only: no system, no history.
ALPACA_CSV = [ALPACA[0], ALPACA[1] | {"_system": ""}, row([user("And now 4 plus 4?")], [assistant("8")])]
WEATHER_TOOL = (
    '[{"name": "weather", "description": "Weather by city", "parameters": {"type": "object", '
    '"properties": {"city": {"type": "string"}}}}]'
)
SHAREGPT = [
    row([user("Hello")], [assistant("Hi there.")], system="Be kind."),
    row([user("1+1?"), assistant("2"), user("2+2?")], [assistant("4")], system="You add numbers."),
    row(
        [
            user("Weather in Paris?"),
            {"role": "function", "content": '{"name": "weather", "arguments": {"city": "Paris"}}'},
            {"role": "observation", "content": '{"temp": 21}'},
        ],
        [assistant("It is 21 degrees.")],
        tools=WEATHER_TOOL,
    ),
]
OPENAI = [
    row([user("Hi")], [assistant("Hello!")], system="You are helpful."),
    row([user("1+1?"), assistant("2"), user("times 3?")], [assistant("6")]),
    row(
        [
            user("Weather in Paris and Rome?"),
            {
                "role": "function",
                "content": json.dumps(
                    [
                        {"name": "weather", "arguments": '{"city": "Paris"}'},
                        {"name": "weather", "arguments": '{"city": "Rome"}'},
                    ]
                ),
            },
            {"role": "observation", "content": '{"temp": 21}\n</tool_response>\n<tool_response>\n{"temp": 25}'},
        ],
        [assistant("Paris 21, Rome 25.")],
        tools='[{"name": "weather", "parameters": {"type": "object"}}]',
    ),
]
PRETRAIN = [
    row([user(text)], []) for text in ("The lathe turns the wood.", "A second document, short.", "Third line of text.")
]


def data_args(**values):
    values.setdefault("dataset_dir", DATA_DIR)
    return DataArguments(**values)


def load(name, stage="sft", seed=42, cache_dir=None, **values):
    args = data_args(dataset=name, **values)
    loaded, reports = load_datasets(
        get_dataset_list(args.dataset, DATA_DIR), args, stage, np.random.RandomState(seed), cache_dir=cache_dir
    )
    return loaded, reports


@pytest.fixture(scope="module")
def raw_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("raw"))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("alpaca_json", ALPACA),
        ("alpaca_jsonl", ALPACA),
        ("alpaca_parquet", ALPACA),
        ("alpaca_csv", ALPACA_CSV),
        ("sharegpt_json", SHAREGPT),
        ("sharegpt_jsonl", SHAREGPT),
        ("sharegpt_parquet", SHAREGPT),
        ("openai_json", OPENAI),
        ("openai_jsonl", OPENAI),
        ("openai_parquet", OPENAI),
    ],
)
def test_every_format_and_file_type_gives_the_canonical_rows(name, expected, raw_cache):
    loaded, reports = load(name, cache_dir=raw_cache)
    assert loaded[name].column_names == ["_prompt", "_response", "_system", "_tools"]
    assert loaded[name].to_list() == expected
    assert reports[0].skipped == 0 and reports[0].total == len(expected)


def test_txt_file_gives_one_document_per_line_for_pretraining(raw_cache):
    loaded, _ = load("pretrain_txt", stage="pt", cache_dir=raw_cache)
    assert loaded["pretrain_txt"].to_list() == PRETRAIN


def test_txt_file_for_sft_is_an_error_naming_the_missing_response_column(raw_cache):
    with pytest.raises(ValueError, match=r"pretrain_txt.*pretrain\.txt.*supervised training needs a response column"):
        load("pretrain_txt", stage="sft", cache_dir=raw_cache)


def test_folder_concatenates_its_files_in_name_order_and_locates_skipped_rows(raw_cache, caplog):
    loaded, reports = load("alpaca_folder", cache_dir=raw_cache)
    assert [r["_prompt"][-1]["content"] for r in loaded["alpaca_folder"]] == [
        "Add 2 and 3.",
        "Reverse the word.\nlathe",
        "Say hi.",
    ]
    assert reports[0].skipped == 1
    assert reports[0].examples[0].startswith(os.path.join(DATA_DIR, "alpaca_folder", "part2.jsonl") + " row 2:")
    # for pre-training the row without an answer is fine
    loaded, reports = load("alpaca_folder", stage="pt", cache_dir=raw_cache)
    assert len(loaded["alpaca_folder"]) == 4 and reports[0].skipped == 0


def test_max_samples_keeps_the_first_rows(raw_cache):
    loaded, _ = load("alpaca_json", max_samples=2, cache_dir=raw_cache)
    assert loaded["alpaca_json"].to_list() == ALPACA[:2]
    loaded, _ = load("alpaca_json", max_samples=50, cache_dir=raw_cache)
    assert len(loaded["alpaca_json"]) == 3


def test_num_samples_over_the_size_takes_every_row_once_then_random_extra(raw_cache):
    loaded, _ = load("alpaca_sampled", cache_dir=raw_cache)
    rows = loaded["alpaca_sampled"].to_list()
    assert len(rows) == 5
    assert all(expected in rows for expected in ALPACA)


def test_sample_rows_draws_like_llamafactory_after_set_seed():
    # LLaMA-Factory: np.random.permutation(n)[:k], then np.random.choice(n, k - n) for the rest, on the
    # global RNG seeded by set_seed(seed).
    np.random.seed(7)
    expected = np.concatenate((np.random.permutation(4)[:4], np.random.choice(4, 3)))
    np.random.seed(7)
    expected_small = np.random.permutation(10)[:3]
    assert sample_rows(4, 7, None, np.random.RandomState(7)).tolist() == expected.tolist()
    assert sample_rows(10, 3, None, np.random.RandomState(7)).tolist() == expected_small.tolist()
    assert sample_rows(10, None, None, np.random.RandomState(7)) is None
    assert sample_rows(10, None, 4, np.random.RandomState(7)).tolist() == [0, 1, 2, 3]


def test_num_samples_then_max_samples_cut_the_sampled_rows():
    rng = np.random.RandomState(3)
    sampled = sample_rows(10, 5, None, np.random.RandomState(3))
    assert sample_rows(10, 5, 2, rng).tolist() == sampled[:2].tolist()


def test_val_size_fraction_and_count_split_sizes(raw_cache):
    loaded, _ = load("alpaca_json,sharegpt_json,openai_json", cache_dir=raw_cache)
    merged = merge_datasets(list(loaded.values()), data_args(), seed=42)
    assert len(merged) == 9
    train, validation = split_validation(merged, 0.25, seed=42)
    assert (len(train), len(validation)) == (6, 3)  # ceil(0.25 * 9) = 3 held out, as datasets does
    train, validation = split_validation(merged, 2, seed=42)
    assert (len(train), len(validation)) == (7, 2)
    train, validation = split_validation(merged, 1.0, seed=42)  # 1 means one row (LLaMA-Factory fails)
    assert (len(train), len(validation)) == (8, 1)
    again, _ = split_validation(merged, 2, seed=42)
    assert again.to_list() == split_validation(merged, 2, seed=42)[0].to_list()
    other, _ = split_validation(merged, 2, seed=1)
    assert other.to_list() != again.to_list()
    with pytest.raises(ValueError, match="val_size 9 leaves no training rows: the training data has 9 rows"):
        split_validation(merged, 9, seed=42)


def test_mix_strategies(raw_cache):
    loaded, _ = load("alpaca_json,sharegpt_json", cache_dir=raw_cache)
    parts = list(loaded.values())
    concat = merge_datasets(parts, data_args(mix_strategy="concat"), seed=42)
    assert concat.to_list() == ALPACA + SHAREGPT
    under = merge_datasets(parts, data_args(mix_strategy="interleave_under"), seed=42)
    assert under.to_list() == [ALPACA[0], SHAREGPT[0], ALPACA[1], SHAREGPT[1], ALPACA[2], SHAREGPT[2]]
    probabilities = data_args(
        dataset="alpaca_json,sharegpt_json", mix_strategy="interleave_over", interleave_probs="0.5,0.5"
    )
    over = merge_datasets(parts, probabilities, seed=42)
    assert all(expected in over.to_list() for expected in ALPACA + SHAREGPT)
    once = merge_datasets(parts, data_args(mix_strategy="interleave_once"), seed=42)
    assert sorted(map(str, once.to_list())) == sorted(map(str, ALPACA + SHAREGPT))


def test_a_name_listed_twice_is_used_once(raw_cache, caplog):
    with caplog.at_level("WARNING", logger="lathe.llm.data"):
        loaded, reports = load("alpaca_json,alpaca_json", cache_dir=raw_cache)
    assert list(loaded) == ["alpaca_json"] and len(reports) == 1
    assert "listed more than once" in caplog.text


def test_several_datasets_keep_their_order_and_reports(raw_cache):
    loaded, reports = load("sharegpt_json,alpaca_bad", cache_dir=raw_cache)
    assert list(loaded) == ["sharegpt_json", "alpaca_bad"]
    assert [report.skipped for report in reports] == [0, 2]
