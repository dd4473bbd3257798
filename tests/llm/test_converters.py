"""Format conversion (lathe.llm.data.converters): per-row rules, malformed rows reported with file and
row, skip counts, zero usable rows, and equality with LLaMA-Factory 0.9.5's converter on the same files
(tests/llm/golden/llamafactory_converted.json, made by make_llamafactory_converted.py)."""

import json
import os

import numpy as np
import pytest

from lathe.llm.config.train import DataArguments
from lathe.llm.data.conversion import convert_example
from lathe.llm.data.loader import load_datasets
from lathe.llm.data.registry import DatasetAttr, get_dataset_list

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(HERE, "data")
GOLDEN = os.path.join(HERE, "golden", "llamafactory_converted.json")


def sharegpt_attr(**tags):
    return DatasetAttr(name="t", file_name="t.json", info_path="info.json", formatting="sharegpt", **tags)


def openai_attr():
    return DatasetAttr(
        name="t",
        file_name="t.json",
        info_path="info.json",
        formatting="openai",
        messages="messages",
        role_tag="role",
        content_tag="content",
        user_tag="user",
        assistant_tag="assistant",
        observation_tag="tool",
        function_tag="function",
        system_tag="system",
        tools="tools",
    )


def alpaca_attr(**columns):
    return DatasetAttr(name="t", file_name="t.json", info_path="info.json", **columns)


def turn(speaker, text):
    return {"from": speaker, "value": text}


def convert(example, attr, require_response=True):
    row = convert_example(example, attr, require_response)
    return row.pop("_problem"), row


# ---- alpaca ----------------------------------------------------------------------------------------


def test_alpaca_joins_instruction_and_input_and_puts_history_first():
    problem, row = convert(
        {"instruction": "Sum", "input": "1 2", "output": "3", "history": [["hi", "hello"]], "system": "S"},
        alpaca_attr(history="history", system="system"),
    )
    assert problem == ""
    assert row == {
        "_prompt": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "Sum\n1 2"},
        ],
        "_response": [{"role": "assistant", "content": "3"}],
        "_system": "S",
        "_tools": "",
    }


def test_alpaca_empty_parts_are_left_out_and_missing_columns_are_none():
    problem, row = convert({"instruction": "", "input": "only input", "output": "x"}, alpaca_attr())
    assert row["_prompt"] == [{"role": "user", "content": "only input"}]
    _, row = convert({"instruction": "no input column", "output": "x"}, alpaca_attr())
    assert row["_prompt"] == [{"role": "user", "content": "no input column"}]


def test_alpaca_without_answer_is_unsupervised_for_pretraining_and_a_problem_for_sft():
    assert convert({"instruction": "doc", "output": None}, alpaca_attr(), require_response=False)[1]["_response"] == []
    problem, row = convert({"instruction": "doc", "output": None}, alpaca_attr())
    assert problem.startswith("missing response\t") and row["_prompt"] == []


def test_tools_written_as_json_become_text():
    _, row = convert({"instruction": "a", "output": "b", "tools": [{"name": "f"}]}, alpaca_attr(tools="tools"))
    assert row["_tools"] == '[{"name": "f"}]'


@pytest.mark.parametrize(
    "example, text",
    [
        ({"instruction": ["a"], "output": "b"}, "wrong type\tcolumn 'instruction' (prompt) is list, expected a string"),
        ({"instruction": "a", "output": 5}, "wrong type\tcolumn 'output' (response) is int, expected a string"),
        (
            {"instruction": "a", "output": "b", "history": "x"},
            "wrong type\tcolumn 'history' (history) is string, expected a list of [prompt, response] pairs",
        ),
        (
            {"instruction": "a", "output": "b", "history": [["only one"]]},
            "wrong type\thistory item 1 is list of length 1, expected a [prompt, response] pair",
        ),
        (
            {"instruction": "a", "output": "b", "history": [["q", None]]},
            "missing value\thistory item 1 response is missing",
        ),
    ],
)
def test_alpaca_malformed_rows(example, text):
    assert convert(example, alpaca_attr(history="history"))[0] == text


# ---- sharegpt --------------------------------------------------------------------------------------


def test_sharegpt_first_system_message_wins_over_the_system_column():
    example = {
        "conversations": [turn("system", "from message"), turn("human", "q"), turn("gpt", "a")],
        "system": "from column",
    }
    problem, row = convert(example, sharegpt_attr(system="system"))
    assert problem == "" and row["_system"] == "from message"
    example["conversations"] = example["conversations"][1:]
    assert convert(example, sharegpt_attr(system="system"))[1]["_system"] == "from column"


def test_sharegpt_tool_turns_map_to_function_and_observation():
    example = {
        "conversations": [
            turn("human", "q"),
            turn("function_call", "call"),
            turn("observation", "result"),
            turn("gpt", "answer"),
        ]
    }
    _, row = convert(example, sharegpt_attr())
    assert [m["role"] for m in row["_prompt"]] == ["user", "function", "observation"]
    assert row["_response"] == [{"role": "assistant", "content": "answer"}]


@pytest.mark.parametrize(
    "messages, text",
    [
        (
            [turn("gpt", "a"), turn("human", "b")],
            "wrong role order\tmessage 1 has from 'gpt' (assistant) where user or "
            "observation is expected (turns must alternate, starting with the user)",
        ),
        (
            [turn("human", "a"), turn("gpt", "b"), turn("human", "c")],
            "odd number of turns\tthe conversation ends with a user turn (3 messages): it must end with an answer",
        ),
        (
            [turn("human", "a"), turn("bot", "b")],
            "unknown role\tmessage 2 has from 'bot', which is none of the tags "
            "'human', 'gpt', 'observation', 'function_call', 'system'",
        ),
        (
            [turn("system", "s"), turn("human", "a"), turn("human", "b")],
            "wrong role order\tmessage 3 has from 'human' (user) where assistant or function is expected "
            "(turns must alternate, starting with the user)",
        ),
        ([turn("system", "s")], "empty conversation\tthe conversation has no messages besides the system prompt"),
        ([turn("human", 3), turn("gpt", "b")], "wrong type\tmessage 1 content ('value') is int, expected a string"),
        ([turn("human", "a"), "text"], "wrong type\tmessage 2 is string, expected an object with 'from' and 'value'"),
        (
            [{"role": "user", "content": "a"}],
            "missing key\tmessage 1 has no 'from' (role_tag); the messages look "
            "OpenAI-style: set tags {role_tag: role, content_tag: content, user_tag: "
            "user, assistant_tag: assistant, system_tag: system} in dataset_info.json",
        ),
        ("text", "wrong type\tcolumn 'conversations' (messages) is string, expected a list of messages"),
    ],
)
def test_sharegpt_malformed_rows(messages, text):
    assert convert({"conversations": messages}, sharegpt_attr())[0] == text


# ---- openai ----------------------------------------------------------------------------------------


def test_openai_tool_calls_and_consecutive_tool_results():
    calls = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
    example = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "content": "r1"},
            {"role": "tool", "content": "r2"},
            {"role": "assistant", "content": "done"},
        ],
        "tools": None,
    }
    problem, row = convert(example, openai_attr())
    assert problem == ""
    assert row["_prompt"] == [
        {"role": "user", "content": "q"},
        {"role": "function", "content": '[{"name": "f", "arguments": "{}"}]'},
        {"role": "observation", "content": "r1\n</tool_response>\n<tool_response>\nr2"},
    ]
    assert row["_system"] == ""  # LLaMA-Factory 0.9.5 would say "detailed thinking off" here


def test_openai_unknown_role_and_bad_tool_calls():
    problem, _ = convert(
        {"messages": [{"role": "user", "content": "q"}, {"role": "robot", "content": "a"}]}, openai_attr()
    )
    assert problem.startswith("unknown role\tmessage 2 has role 'robot'")
    problem, _ = convert(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": ["f"]}]},
        openai_attr(),
    )
    assert problem == "wrong type\tmessage 2 tool_calls must be a list of {'function': {...}} objects"


# ---- whole files: reports -----------------------------------------------------------------------------


def load(names, stage="sft", **values):
    args = DataArguments(dataset=names, dataset_dir=DATA_DIR, **values)
    return load_datasets(get_dataset_list(args.dataset, DATA_DIR), args, stage, np.random.RandomState(42))


def test_malformed_rows_are_skipped_counted_and_located(caplog):
    with caplog.at_level("WARNING", logger="lathe.llm.data"):
        loaded, (report,) = load("sharegpt_bad")
    path = os.path.join(DATA_DIR, "sharegpt_bad.json")
    assert len(loaded["sharegpt_bad"]) == 2 and (report.total, report.skipped) == (7, 5)
    assert dict(report.reasons) == {
        "wrong role order": 1,
        "odd number of turns": 1,
        "unknown role": 1,
        "wrong type": 1,
        "empty conversation": 1,
    }
    assert [example.split(":")[0] for example in report.examples] == [f"{path} row {n}" for n in (2, 3, 5, 6, 7)]
    assert "dataset 'sharegpt_bad': skipped 5 of 7 rows (" in caplog.text
    assert f"{path} row 6: column 'conversations' (messages) is string, expected a list of messages" in caplog.text


def test_skip_report_names_only_the_first_rows_and_counts_the_rest():
    from collections import Counter

    from lathe.llm.data.converters import ConversionReport

    report = ConversionReport(
        "d",
        total=100,
        skipped=40,
        reasons=Counter({"odd number of turns": 40}),
        examples=[f"f.json row {n}: x" for n in range(1, 6)],
    )
    assert report.summary().splitlines()[0] == "dataset 'd': skipped 40 of 100 rows (40 odd number of turns)"
    assert report.summary().splitlines()[-1] == "  ... and 35 more"
    assert ConversionReport.from_dict(report.to_dict()) == report


def test_zero_usable_rows_is_an_error_quoting_the_problems():
    with pytest.raises(ValueError) as raised:
        load("sharegpt_all_bad")
    message = str(raised.value)
    assert "dataset 'sharegpt_all_bad' in" in message and "no usable rows" in message
    assert "skipped 2 of 2 rows" in message
    assert f"{os.path.join(DATA_DIR, 'sharegpt_all_bad.jsonl')} row 1: message 1 has from 'gpt'" in message


def test_json_syntax_error_names_file_line_and_column():
    with pytest.raises(ValueError, match=r"broken\.json line 3 column 22: Expecting ',' delimiter"):
        load("broken_json")


def test_named_column_missing_from_the_file():
    with pytest.raises(
        ValueError,
        match=r"column 'question' \(prompt\) not found; the file has: instruction, input, "
        r"output, system, history",
    ):
        load("named_column_missing")


def test_default_columns_missing_from_a_text_file_say_how_to_map_them():
    with pytest.raises(
        ValueError,
        match=r'no prompt column: .*Map yours in dataset_info.json, e.g. "columns": '
        r'\{"prompt": "text"\}',
    ):
        load("txt_without_columns", stage="pt")


# ---- LLaMA-Factory golden -----------------------------------------------------------------------------


def golden_rows():
    with open(GOLDEN, encoding="utf-8") as handle:
        return json.load(handle)["rows"]


def undo_llamafactory_openai_system(row):
    """LLaMA-Factory 0.9.5's openai converter appends "detailed thinking off" to the system prompt when
    there are no tools (and a newline when there are); lathe keeps the data's system prompt as it is."""
    system, tools = row["_system"] or "", row["_tools"] or ""
    if not tools:
        system = "" if system == "detailed thinking off" else system.removesuffix("\ndetailed thinking off")
    elif system:
        system = system.removesuffix("\n")
    return {**row, "_system": system}


def normalise(row):
    return {**row, "_system": row["_system"] or "", "_tools": row["_tools"] or ""}


def in_file_order(name, rows):
    """LLaMA-Factory reads a folder's files in os.listdir order (whatever the file system gives); lathe in
    name order, so that a run does not depend on the disk. Compare folders as sorted rows."""
    return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True)) if name.endswith("folder") else rows


def usable_for_sft(row):  # LLaMA-Factory's supervised processor keeps exactly these
    return len(row["_prompt"]) % 2 == 1 and len(row["_response"]) == 1


@pytest.mark.parametrize(
    "name",
    [
        "alpaca_json",
        "alpaca_jsonl",
        "alpaca_parquet",
        "alpaca_csv",
        "alpaca_folder",
        "sharegpt_json",
        "sharegpt_jsonl",
        "sharegpt_parquet",
        "openai_json",
        "openai_jsonl",
        "openai_parquet",
        "sharegpt_roles",
        "alpaca_sampled",
        "alpaca_sampled_2",
    ],
)
def test_sft_rows_equal_llamafactorys(name):
    expected = [normalise(row) for row in golden_rows()[name] if usable_for_sft(row)]
    if name.startswith("openai"):
        expected = [undo_llamafactory_openai_system(row) for row in expected]
    loaded, (report,) = load(name)
    assert in_file_order(name, loaded[name].to_list()) == in_file_order(name, expected)
    assert report.skipped == len(golden_rows()[name]) - len(expected)


@pytest.mark.parametrize("name", ["pretrain_txt", "alpaca_folder"])
def test_pretraining_rows_equal_llamafactorys(name):
    loaded, _ = load(name, stage="pt")
    expected = [normalise(row) for row in golden_rows()[name]]
    assert in_file_order(name, loaded[name].to_list()) == in_file_order(name, expected)


def test_rows_llamafactory_drops_are_the_rows_lathe_reports():
    golden = golden_rows()["sharegpt_roles"]
    dropped = [number for number, row in enumerate(golden, start=1) if not usable_for_sft(row)]
    _, (report,) = load("sharegpt_roles")
    assert dropped == [2, 3, 4, 6, 8, 9]
    assert [int(example.split(" row ")[1].split(":")[0]) for example in report.examples] == dropped[:5]
    assert report.skipped == len(dropped)
