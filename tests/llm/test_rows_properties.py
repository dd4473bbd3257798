"""Dataset rows at random (hypothesis), in each format (alpaca, sharegpt, openai) and file type: every row
either reaches the canonical rows with its text exactly as written, or is a counted skip naming its row;
never a crash, never a silent change of the text. The canonical rows then tokenize without a crash (each
example encoded or counted as skipped)."""

import csv
import json
from collections import Counter

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lathe.llm.config.train import DataArguments  # noqa: E402
from lathe.llm.data.loader import load_datasets  # noqa: E402
from lathe.llm.data.registry import get_dataset_list  # noqa: E402
from lathe.llm.data.supervised import preprocess_supervised_dataset  # noqa: E402
from lathe.llm.templates.resolve import get_template_and_fix_tokenizer  # noqa: E402
from tests.llm.conftest import build_word_tokenizer  # noqa: E402

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TRICKY = st.sampled_from(
    [
        "887",
        "0",
        "-1",
        "1e5",
        "true",
        "null",
        "None",
        "NA",
        "2021-01-01",
        '{"a": 1}',
        "[1, 2]",
        "  7 ",
        "",
        " ",
        "\n",
        "a\r\nb",
        "tab\there",
        "naïve ☃ 日本",
        "\\u00e9",
        "#comment",
    ]
)
TEXT = TRICKY | st.text(max_size=20)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=5,
)
VALUE = TEXT | TEXT | TEXT | JSON  # mostly text, sometimes anything
OPENAI_TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "tool",
    "function_tag": "function",
    "system_tag": "system",
}


def write(folder, name: str, rows: list, entry: dict) -> None:
    path = folder / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    elif name.endswith(".csv"):
        with open(path, "w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["instruction", "input", "output"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    (folder / "dataset_info.json").write_text(json.dumps({"d": {"file_name": name, **entry}}), encoding="utf-8")


def load(folder, rows, expected_rows):
    """Load the file; check the kept rows and the skip report against `expected_rows` (None: must be skipped)."""
    args = DataArguments(dataset="d", dataset_dir=str(folder))
    skipped = [number for number, expected in enumerate(expected_rows, start=1) if expected is None]
    try:
        loaded, (report,) = load_datasets(get_dataset_list("d", str(folder)), args, "sft", np.random.RandomState(0))
    except ValueError as error:  # every row was skipped: the error quotes the first problems
        assert len(skipped) == len(rows), str(error)
        assert f"skipped {len(rows)} of {len(rows)} rows" in str(error)
        return []
    converted = loaded["d"].to_list()
    assert converted == [expected for expected in expected_rows if expected is not None]
    assert report.skipped == len(skipped)
    assert [int(example.split(" row ")[1].split(":")[0]) for example in report.examples] == skipped[:5]
    return converted


def tokenizes_or_counts(converted) -> None:
    if not converted:
        return
    tokenizer = build_word_tokenizer()
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="qwen"))
    batch = {key: [row[key] for row in converted] for key in converted[0]}
    skipped = Counter()
    out = preprocess_supervised_dataset(batch, template, tokenizer, DataArguments(cutoff_len=64), skipped=skipped)
    assert len(out["input_ids"]) + sum(skipped.values()) == len(converted)


# ---- alpaca ---------------------------------------------------------------------------------------------

ALPACA_COLUMNS = ("instruction", "input", "output", "system", "history")
ALPACA_ROW = st.fixed_dictionaries(
    {},
    optional={
        "instruction": VALUE,
        "input": VALUE,
        "output": VALUE,
        "system": VALUE,
        "history": st.lists(st.lists(VALUE, min_size=2, max_size=2) | JSON, max_size=2) | JSON,
    },
)


def alpaca_expected(row: dict):
    """The canonical row LLaMA-Factory's rules give, or None for a row that must be skipped."""
    texts = [row.get(key) for key in ("instruction", "input", "output", "system")]
    history = row.get("history")
    if not all(text is None or isinstance(text, str) for text in texts) or not isinstance(row.get("output"), str):
        return None
    if history is not None and not (
        isinstance(history, list)
        and all(isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair) for pair in history)
    ):
        return None
    prompt = [
        {"role": role, "content": text} for pair in history or [] for role, text in zip(("user", "assistant"), pair)
    ]
    prompt.append({"role": "user", "content": "\n".join(text for text in texts[:2] if text)})
    return {
        "_prompt": prompt,
        "_response": [{"role": "assistant", "content": row["output"]}],
        "_system": row.get("system") or "",
        "_tools": "",
    }


@FUZZ
@given(rows=st.lists(ALPACA_ROW, min_size=1, max_size=8), jsonl=st.booleans())
def test_random_alpaca_rows_are_kept_as_written_or_counted(tmp_path_factory, rows, jsonl):
    folder = tmp_path_factory.mktemp("alpaca")
    roles = {"instruction": "prompt", "input": "query", "output": "response", "system": "system", "history": "history"}
    present = [key for key in ALPACA_COLUMNS if any(key in row for row in rows)]  # columns of the file
    write(folder, "d.jsonl" if jsonl else "d.json", rows, {"columns": {roles[key]: key for key in present}})
    if "output" not in present or not {"instruction", "input"} & set(present):
        with pytest.raises(ValueError, match="column|empty object"):  # one error about the file, not a row problem
            load_datasets(
                get_dataset_list("d", str(folder)),
                DataArguments(dataset="d", dataset_dir=str(folder)),
                "sft",
                np.random.RandomState(0),
            )
        return
    tokenizes_or_counts(load(folder, rows, [alpaca_expected(row) for row in rows]))


@FUZZ
@given(
    rows=st.lists(st.fixed_dictionaries({"instruction": TEXT, "input": TEXT, "output": TEXT}), min_size=1, max_size=8)
)
def test_random_csv_cells_are_kept_as_written(tmp_path_factory, rows):
    folder = tmp_path_factory.mktemp("csv")
    write(folder, "d.csv", rows, {})
    # CSV cannot tell an empty cell from a missing one: both are missing (no answer: a skipped row)
    cells = [{key: text or None for key, text in row.items()} for row in rows]
    load(folder, rows, [alpaca_expected(row) for row in cells])


# ---- sharegpt -------------------------------------------------------------------------------------------

SHAREGPT_TAGS = {"human": "user", "gpt": "assistant", "observation": "observation", "function_call": "function"}
TAG = st.sampled_from(["human", "gpt", "human", "gpt", "observation", "function_call", "system"]) | JSON
MESSAGE = st.fixed_dictionaries({"from": TAG, "value": VALUE}) | JSON
VALID_TURNS = st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3).map(
    lambda pairs: [
        message
        for user, answer in pairs
        for message in ({"from": "human", "value": user}, {"from": "gpt", "value": answer})
    ]
)
SHAREGPT_ROW = st.fixed_dictionaries(
    {"conversations": VALID_TURNS | st.lists(MESSAGE, max_size=5) | JSON}, optional={"system": VALUE, "tools": VALUE}
)


def sharegpt_expected(row: dict):
    messages, system = row["conversations"], row.get("system")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("from") is not None for m in messages):
        return None
    if messages and messages[0]["from"] == "system":
        system, messages = messages[0].get("value"), messages[1:]
        if not isinstance(system, str):
            return None
    elif system is not None and not isinstance(system, str):
        return None
    roles = []
    for index, message in enumerate(messages):
        role = SHAREGPT_TAGS.get(message["from"]) if isinstance(message["from"], str) else None
        expected = ("user", "observation") if index % 2 == 0 else ("assistant", "function")
        if role not in expected or not isinstance(message.get("value"), str):
            return None
        roles.append(role)
    tools = row.get("tools")
    if not messages or len(messages) % 2 or not (tools is None or isinstance(tools, (str, list, dict))):
        return None
    aligned = [{"role": role, "content": message["value"]} for role, message in zip(roles, messages)]
    tools_text = json.dumps(tools, ensure_ascii=False) if isinstance(tools, (list, dict)) else tools or ""
    return {"_prompt": aligned[:-1], "_response": aligned[-1:], "_system": system or "", "_tools": tools_text}


@FUZZ
@given(rows=st.lists(SHAREGPT_ROW, min_size=1, max_size=8), jsonl=st.booleans())
def test_random_sharegpt_rows_are_kept_as_written_or_counted(tmp_path_factory, rows, jsonl):
    folder = tmp_path_factory.mktemp("sharegpt")
    columns = {
        "messages": "conversations",
        **{key: key for key in ("system", "tools") if any(key in row for row in rows)},
    }
    write(folder, "d.jsonl" if jsonl else "d.json", rows, {"formatting": "sharegpt", "columns": columns})
    tokenizes_or_counts(load(folder, rows, [sharegpt_expected(row) for row in rows]))


# ---- openai ---------------------------------------------------------------------------------------------

OPENAI_ROLES = {"user": "user", "assistant": "assistant"}
OPENAI_MESSAGE = (
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "bot"]) | JSON, "content": VALUE})
    | JSON
)
OPENAI_VALID = st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3).map(
    lambda pairs: [
        message
        for user, answer in pairs
        for message in ({"role": "user", "content": user}, {"role": "assistant", "content": answer})
    ]
)
OPENAI_ROW = st.fixed_dictionaries({"messages": OPENAI_VALID | st.lists(OPENAI_MESSAGE, max_size=5) | JSON})


def openai_expected(row: dict):
    """Rows without tool messages: user / assistant turns after an optional leading system message."""
    messages = row["messages"]
    if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") is not None for m in messages):
        return None
    system = ""
    if messages and messages[0]["role"] == "system":
        system, messages = messages[0].get("content"), messages[1:]
        if not isinstance(system, str):
            return None
    aligned = []
    for index, message in enumerate(messages):
        expected = "user" if index % 2 == 0 else "assistant"
        if message["role"] != expected or not isinstance(message.get("content"), str):
            return None
        aligned.append({"role": expected, "content": message["content"]})
    if not aligned or len(aligned) % 2:
        return None
    return {"_prompt": aligned[:-1], "_response": aligned[-1:], "_system": system, "_tools": ""}


@FUZZ
@given(rows=st.lists(OPENAI_ROW, min_size=1, max_size=8), jsonl=st.booleans())
def test_random_openai_rows_are_kept_as_written_or_counted(tmp_path_factory, rows, jsonl):
    folder = tmp_path_factory.mktemp("openai")
    write(
        folder,
        "d.jsonl" if jsonl else "d.json",
        rows,
        {"formatting": "openai", "columns": {"messages": "messages"}, "tags": OPENAI_TAGS},
    )
    tokenizes_or_counts(load(folder, rows, [openai_expected(row) for row in rows]))


@pytest.mark.parametrize(
    "tools, call",
    [
        ("887", '{"name": "f", "arguments": {}}'),  # tools written as a JSON number (it crashed with TypeError: len())
        ("null", '{"name": "f", "arguments": {}}'),
        (
            '[{"name": "f", "parameters": {"type": "object", "properties": {}}}]',
            "[" * 50_000 + "]" * 50_000,
        ),  # RecursionError
    ],
)
def test_tools_and_calls_that_cannot_be_rendered_are_counted_skips(tools, call):
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "function", "content": call},
        {"role": "observation", "content": "1"},
    ]
    batch = {
        "_prompt": [conversation],
        "_response": [[{"role": "assistant", "content": "ok"}]],
        "_system": [""],
        "_tools": [tools],
    }
    tokenizer = build_word_tokenizer()
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="qwen"))
    skipped = Counter()
    out = preprocess_supervised_dataset(batch, template, tokenizer, DataArguments(cutoff_len=64), skipped=skipped)
    assert out["input_ids"] == [] and sum(skipped.values()) == 1
