"""The dataset registry (lathe.llm.data.registry): LLaMA-Factory's dataset_info.json schema and the
error messages, each naming the registry file, the dataset and the key."""

import json
import os
import re

import pytest

from lathe.llm.data.registry import get_dataset_list, load_dataset_info, resolve_data_files

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
INFO = os.path.join(DATA_DIR, "dataset_info.json")


def attr(name):
    return get_dataset_list([name], DATA_DIR)[0]


def error(name, kind=ValueError):
    with pytest.raises(kind) as raised:
        attr(name) if not name.startswith("files:") else resolve_data_files(attr(name[6:]), DATA_DIR)
    return str(raised.value)


def test_defaults_are_llamafactorys():
    csv = attr("alpaca_csv")
    assert (csv.formatting, csv.split, csv.num_samples) == ("alpaca", "train", None)
    assert (csv.prompt, csv.query, csv.response, csv.history, csv.system, csv.tools) == (
        "instruction",
        "input",
        "output",
        None,
        None,
        None,
    )
    sharegpt = attr("sharegpt_roles")
    assert sharegpt.messages == "conversations"
    assert (
        sharegpt.role_tag,
        sharegpt.content_tag,
        sharegpt.user_tag,
        sharegpt.assistant_tag,
        sharegpt.observation_tag,
        sharegpt.function_tag,
        sharegpt.system_tag,
    ) == ("from", "value", "human", "gpt", "observation", "function_call", "system")


def test_columns_replace_every_default_column_name():
    # LLaMA-Factory semantics: the names a `columns` object leaves out are None, not their defaults.
    text = attr("pretrain_txt")
    assert (text.prompt, text.query, text.response, text.messages) == ("text", None, None, None)
    assert text.implicit_columns == ()


def test_tags_replace_every_default_tag():
    openai = attr("openai_json")
    assert (openai.formatting, openai.messages, openai.tools) == ("openai", "messages", "tools")
    assert (openai.role_tag, openai.user_tag, openai.observation_tag, openai.system_tag) == (
        "role",
        "user",
        "tool",
        "system",
    )


def test_names_and_comma_lists_keep_their_order():
    assert [a.name for a in get_dataset_list("sharegpt_json, alpaca_csv", DATA_DIR)] == ["sharegpt_json", "alpaca_csv"]
    assert get_dataset_list(None, DATA_DIR) == []
    assert attr("alpaca_sampled").num_samples == 5


def test_registry_may_be_given_as_a_dict():
    info = {"mine": {"file_name": "alpaca.json"}}
    assert get_dataset_list(["mine"], info)[0].file_name == "alpaca.json"


def test_files_of_a_file_and_of_a_folder():
    assert resolve_data_files(attr("alpaca_jsonl"), DATA_DIR) == ([os.path.join(DATA_DIR, "alpaca.jsonl")], "json")
    assert resolve_data_files(attr("pretrain_txt"), DATA_DIR)[1] == "text"
    files, builder = resolve_data_files(attr("alpaca_folder"), DATA_DIR)
    assert [os.path.basename(f) for f in files] == ["part1.jsonl", "part2.jsonl"] and builder == "json"


def test_unknown_dataset_suggests_the_closest_name():
    message = error("alpaca_jsn")
    assert f"Undefined dataset 'alpaca_jsn' in {INFO}; did you mean 'alpaca_json'?" in message
    assert "Registered: alpaca_bad, alpaca_csv" in message


def test_missing_file_names_the_entry_and_suggests_a_file():
    message = error("files:missing_file", FileNotFoundError)
    assert message == (
        f"dataset 'missing_file' in {INFO} (key 'file_name'): file 'alpaca_missing.json' not found "
        f"(looked for {os.path.join(DATA_DIR, 'alpaca_missing.json')}); did you mean 'alpaca.json'?"
    )


def test_unknown_formatting_suggests_one():
    assert error("unknown_formatting") == (
        f"dataset 'unknown_formatting' in {INFO} (key 'formatting'): unknown formatting 'sharegtp'; "
        f"did you mean 'sharegpt'? Use one of: alpaca, sharegpt, openai."
    )


def test_script_sources_are_a_clear_error():
    assert error("script_dataset") == (
        f"dataset 'script_dataset' in {INFO} (key 'script_url'): loads 'my_script' from a script or cloud: "
        f"lathe does not run dataset scripts or read cloud storage; download the data and point file_name at it."
    )


@pytest.mark.parametrize(
    "name, key, source",
    [("hub_dataset", "hf_hub_url", "llamafactory/alpaca_en"), ("ms_dataset", "ms_hub_url", "llamafactory/alpaca_zh")],
)
def test_hub_entries_name_their_repository(name, key, source):
    (attr,) = get_dataset_list([name], DATA_DIR)
    assert attr.hub_urls == {key: source} and attr.snapshot is None  # downloaded when the data is loaded


def test_online_dataset_dir_is_a_clear_error():
    with pytest.raises(ValueError, match="reads the registry from a hub, which lathe does not do"):
        get_dataset_list(["x"], "ONLINE")


def test_bad_column_name_and_bad_entry_key_suggest_the_right_one():
    assert "(key 'columns'): unknown name 'promt'; did you mean 'prompt'?" in error("bad_column_key")
    assert "dataset 'typo_entry_key'" in error("typo_entry_key")
    assert "unknown key 'column'; did you mean 'columns'?" in error("typo_entry_key")


def test_partial_tags_name_the_missing_tag():
    message = error("partial_tags")
    assert message.startswith(
        f"dataset 'partial_tags' in {INFO} (key 'tags'): 'user_tag' is not set; `tags` replaces every default tag"
    )


@pytest.mark.parametrize(
    "name, text",
    [
        (
            "ranking_dataset",
            "(key 'columns'): ranking data needs the chosen and rejected columns: name them in "
            '`columns`, e.g. {"chosen": "chosen", "rejected": "rejected"}.',
        ),
    ],
)
def test_unsupported_kinds_of_data_say_so(name, text):
    assert error(name) == f"dataset '{name}' in {INFO} {text}"


def test_mixed_folder_and_unsupported_extension():
    assert "mixes file types (json: a.json; csv: b.csv)" in error("files:mixed_folder")
    assert re.search(
        r"notes\.xml has an unsupported file type '\.xml'; allowed: \.json, \.jsonl, \.csv, \.parquet, "
        r"\.txt",
        error("files:xml_file"),
    )


def write_info(folder, info):
    path = os.path.join(folder, "dataset_info.json")
    with open(path, "w") as handle:
        handle.write(info if isinstance(info, str) else json.dumps(info))
    return path


@pytest.mark.parametrize(
    "entry, text",
    [
        ({"formatting": "alpaca"}, "no 'file_name'"),
        ({"file_name": "a.json", "num_samples": 0}, "(key 'num_samples'): must be a positive integer, got 0"),
        ({"file_name": "a.json", "columns": ["prompt"]}, "(key 'columns'): must be a JSON object, found a list"),
        (
            {"file_name": "a.json", "formatting": "sharegpt", "columns": {"system": "system"}},
            "sharegpt data needs a 'messages' column; note that `columns` replaces every default column name",
        ),
        ({"file_name": "a.json", "columns": {"response": "output"}}, "alpaca data needs a 'prompt' or 'query' column"),
        ({"file_name": "a.json", "columns": {"prompt": 3}}, "'prompt' must be a non-empty string, got 3"),
        ("just a string", "must be a JSON object, found a str"),
    ],
)
def test_malformed_entries(tmp_path, entry, text):
    path = write_info(tmp_path, {"mine": entry})
    with pytest.raises(ValueError) as raised:
        get_dataset_list(["mine"], str(tmp_path))
    assert str(raised.value).startswith(f"dataset 'mine' in {path}")
    assert text in str(raised.value)


def test_missing_and_invalid_registry_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no dataset_info.json: the registry .* is needed"):
        get_dataset_list(["x"], str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_dataset_list(["x"], str(tmp_path / "nowhere"))
    path = write_info(tmp_path, '{"a": {"file_name": "x.json",}}')
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{path} is not valid JSON: Expecting property name enclosed in double quotes at line 1, column 30"
        ),
    ):
        load_dataset_info(str(tmp_path))
    write_info(tmp_path, "[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object mapping dataset names to entries, found a list"):
        get_dataset_list(["x"], str(tmp_path))


def test_empty_folder_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    write_info(tmp_path, {"mine": {"file_name": "empty"}})
    with pytest.raises(ValueError, match="the folder .*empty holds no data files"):
        resolve_data_files(get_dataset_list(["mine"], str(tmp_path))[0], str(tmp_path))


def test_hub_entry_needs_no_file_name_and_a_repository_id():
    (attr,) = get_dataset_list(["x"], {"x": {"hf_hub_url": "Org/Data", "subset": "en", "folder": "data"}})
    assert (attr.hub_urls, attr.subset, attr.folder, attr.file_name) == ({"hf_hub_url": "Org/Data"}, "en", "data", "")
    with pytest.raises(ValueError, match=r"\(key 'hf_hub_url'\): must be a repository id such as Org/Name, got ''"):
        get_dataset_list(["x"], {"x": {"hf_hub_url": ""}})
    with pytest.raises(ValueError, match="no 'file_name'"):
        get_dataset_list(["x"], {"x": {"formatting": "alpaca"}})
