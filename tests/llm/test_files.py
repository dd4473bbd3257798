"""Data files read exactly as written (lathe.llm.data.files): text columns stay text whatever else the
column holds, a bad row is reported with what the file really holds, and invalid UTF-8 names file, line
and byte. Every file here is written by the test."""

import json

import numpy as np
import pytest

from lathe.llm.config.train import DataArguments
from lathe.llm.data.loader import load_datasets
from lathe.llm.data.registry import get_dataset_list

OPENAI_TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "tool",
    "function_tag": "function",
    "system_tag": "system",
}


def write_dataset(folder, file_name, content, **entry):
    """Write a data file (bytes, text, or rows as JSON / JSON Lines by extension) and its registry entry."""
    path = folder / file_name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    elif file_name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in content), encoding="utf-8")
    else:
        path.write_text(json.dumps(content, ensure_ascii=False, indent=1), encoding="utf-8")
    (folder / "dataset_info.json").write_text(json.dumps({"d": {"file_name": file_name, **entry}}), encoding="utf-8")
    return str(path)


def load(folder, stage="sft"):
    args = DataArguments(dataset="d", dataset_dir=str(folder))
    loaded, (report,) = load_datasets(
        get_dataset_list("d", str(folder)), args, stage, np.random.RandomState(0), cache_dir=str(folder / "raw")
    )
    return loaded["d"].to_list(), report


def answers(rows):
    return [row["_response"][0]["content"] for row in rows]


# The file: strings that look like numbers, a real number and a real list in one column.
MIXED = (
    [{"instruction": f"q{i}", "input": "", "output": str(i)} for i in range(3)]
    + [
        {"instruction": "q3", "input": "", "output": "887"},
        {"instruction": "q4", "input": "", "output": 12},
        {"instruction": "q5", "input": "", "output": ["a", "b"]},
    ]
    + [
        {"instruction": f"q{i}", "input": "", "output": text}
        for i, text in enumerate(["true", "null", "2021-01-01", "1e5", '{"a": 1}', "[1, 2]", "  7 "], start=6)
    ]
)


@pytest.mark.parametrize("file_name", ["mixed.json", "mixed.jsonl"])
def test_text_that_looks_like_json_stays_text_and_only_real_non_strings_are_skipped(tmp_path, file_name):
    path = write_dataset(tmp_path, file_name, MIXED)
    rows, report = load(tmp_path)
    strings = [row["output"] for row in MIXED if isinstance(row["output"], str)]
    assert answers(rows) == strings  # exactly as written: "887" is not 887, "true" not True, "  7 " not 7
    assert (report.total, report.skipped) == (13, 2)
    assert report.examples == [
        f"{path} row 5: column 'output' (response) is int, expected a string",
        f"{path} row 6: column 'output' (response) is list, expected a string",
    ]


def test_dates_in_json_stay_text(tmp_path):
    write_dataset(
        tmp_path,
        "dates.jsonl",
        [
            {"instruction": "when", "output": "2021-01-01"},
            {"instruction": "when exactly", "output": "2022-02-02 10:00:00"},
        ],
    )
    rows, _ = load(tmp_path)
    assert answers(rows) == ["2021-01-01", "2022-02-02 10:00:00"]


def test_csv_cells_are_text_and_only_empty_cells_are_missing(tmp_path):
    write_dataset(
        tmp_path,
        "d.csv",
        "instruction,input,output\nAdd 2 and 3.,,5\nSay none,,None\nSay NA,,NA\n"
        '"Quote ""x""",,0.50\nAnd 4 plus 4?,,8\n',
    )
    rows, report = load(tmp_path)
    assert answers(rows) == ["5", "None", "NA", "0.50", "8"] and report.skipped == 0
    assert [row["_prompt"][0]["content"] for row in rows][3] == 'Quote "x"'  # the empty input is left out


def test_csv_files_of_one_dataset_must_share_their_columns(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "a.csv").write_text("instruction,output\nq,1\n", encoding="utf-8")
    (tmp_path / "parts" / "b.csv").write_text("instruction,answer\nq,2\n", encoding="utf-8")
    (tmp_path / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "parts"}}), encoding="utf-8")
    with pytest.raises(
        ValueError,
        match=r"b\.csv has the columns instruction, answer but .*a\.csv has instruction, "
        r"output",
    ):
        load(tmp_path)


def test_a_number_in_a_parquet_text_column_is_reported_as_the_number_it_is(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"instruction": ["a", "b"], "output": [5, 6]}), str(tmp_path / "d.parquet"))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.parquet"}}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"d\.parquet row 1: column 'output' \(response\) is int, expected a string"):
        load(tmp_path)


def test_sharegpt_message_text_that_looks_like_a_number_stays_text(tmp_path):
    conversations = [
        [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}],
        [{"from": "human", "value": "4+4?"}, {"from": "gpt", "value": 8}],
        [{"from": "human", "value": "yes?"}, {"from": "gpt", "value": "true", "weight": 1}],
    ]
    path = write_dataset(tmp_path, "s.json", [{"conversations": c} for c in conversations], formatting="sharegpt")
    rows, report = load(tmp_path)
    assert answers(rows) == ["4", "true"]
    assert report.examples == [f"{path} row 2: message 2 content ('value') is int, expected a string"]


def test_openai_tool_calls_and_tools_keep_the_file_s_keys_and_order(tmp_path):
    # Arrow merges objects into one struct type: missing keys come back as nulls and keys take the first
    # row's order, which would change the JSON text the model trains on.
    tools_a = [{"name": "weather", "parameters": {"type": "object"}}]
    tools_b = [{"description": "adds", "name": "add", "parameters": {"type": "object", "required": ["a"]}}]
    first = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "21"},
        {"role": "assistant", "content": "21 degrees."},
    ]
    second = [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "tool_calls": [{"function": {"arguments": {"a": 1, "b": 2}, "name": "add"}}]},
        {"role": "tool", "content": "3"},
        {"role": "assistant", "content": "3"},
    ]
    write_dataset(
        tmp_path,
        "o.jsonl",
        [{"messages": first, "tools": tools_a}, {"messages": second, "tools": tools_b}],
        formatting="openai",
        columns={"messages": "messages", "tools": "tools"},
        tags=OPENAI_TAGS,
    )
    rows, report = load(tmp_path)
    assert report.skipped == 0
    assert [row["_tools"] for row in rows] == [json.dumps(tools_a), json.dumps(tools_b)]
    assert rows[1]["_prompt"][1] == {"role": "function", "content": '[{"arguments": {"a": 1, "b": 2}, "name": "add"}]'}
    assert rows[0]["_prompt"][2] == {"role": "observation", "content": "21"}


def test_a_lone_surrogate_is_a_reported_row_not_a_crash(tmp_path):
    path = write_dataset(
        tmp_path, "s.jsonl", '{"instruction": "a", "output": "ok"}\n{"instruction": "b", "output": "bad \\ud800"}\n'
    )
    rows, report = load(tmp_path)
    assert answers(rows) == ["ok"]
    assert report.examples == [
        f"{path} row 2: column 'output' (response) holds '\\ud800', a lone surrogate that is not a Unicode character"
    ]


@pytest.mark.parametrize(
    "file_name, content, line",
    [
        ("d.json", b'[\n {"instruction": "a", "output": "b"},\n {"instruction": "caf\xe9", "output": "c"}\n]', 3),
        ("d.jsonl", b'{"instruction": "a", "output": "b"}\n{"instruction": "ok", "output": "x\xff"}\n', 2),
        ("d.csv", b"instruction,output\nq,a\nq2,\xc3(\n", 3),
        ("d.txt", b"first line\nsecond \x80 line\n", 2),
    ],
)
def test_invalid_utf8_names_the_file_line_and_byte(tmp_path, file_name, content, line):
    path = write_dataset(
        tmp_path, file_name, content, **({"columns": {"prompt": "text"}} if file_name == "d.txt" else {})
    )
    byte = next(offset for offset, value in enumerate(content) if value >= 0x80)
    column = byte - content.rindex(b"\n", 0, byte)
    with pytest.raises(
        ValueError,
        match=rf"{path} line {line}, byte {byte} \(column {column} of the line\): invalid "
        rf"UTF-8 \(byte 0x{content[byte]:02x}",
    ):
        load(tmp_path, stage="pt" if file_name == "d.txt" else "sft")


def test_a_byte_order_mark_is_not_part_of_the_data(tmp_path):
    write_dataset(tmp_path, "d.json", b'\xef\xbb\xbf[{"instruction": "a", "output": "b"}]')
    rows, _ = load(tmp_path)
    assert answers(rows) == ["b"]


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '[{"instruction": "a", "output": "b"}, "text"]',
            r"d\.json item 2 is a string; every item of the list must be an object",
        ),
        (
            '{"instruction": "a", "output": "b"}\n[1, 2]\n',
            r"d\.json line 2 holds a JSON list; each line must be an object",
        ),
        ("5", r"d\.json holds a JSON number; expected a list of objects"),
        ("[]", r"d\.json hold\(s\) no rows"),
    ],
)
def test_json_files_that_are_not_rows_are_clear_errors(tmp_path, content, message):
    write_dataset(tmp_path, "d.json", content)
    with pytest.raises(ValueError, match=message):
        load(tmp_path)


def test_get_dataset_tokenizes_the_text_as_written(tmp_path, word_tokenizer):
    from types import SimpleNamespace

    from lathe.llm.data.pipeline import get_dataset
    from lathe.llm.templates.resolve import get_template_and_fix_tokenizer

    write_dataset(
        tmp_path,
        "d.json",
        [
            {"instruction": "what", "output": "20"},
            {"instruction": "what", "output": 4},
            {"instruction": "what", "output": ["x"]},
        ],
    )
    data_args = DataArguments(dataset="d", dataset_dir=str(tmp_path), template="qwen", cutoff_len=64)
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args)
    module = get_dataset(
        template,
        SimpleNamespace(),
        data_args,
        SimpleNamespace(seed=1),
        "sft",
        word_tokenizer,
        cache_dir=str(tmp_path / "cache"),
    )
    (row,) = module["train_dataset"]
    trained = [label for label in row["labels"] if label != -100]
    assert word_tokenizer.decode(trained).split() == ["20", "<|im_end|>"]
