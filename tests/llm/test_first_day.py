"""The first-day traps (issue 23): a duplicate key in a config or dataset_info.json, a misspelt template,
a cutoff that drops most rows, a rerun into a finished run, the saved run config, and exported folders."""

import json

import pytest

from lathe.llm.config import parse_train_config
from lathe.llm.data.registry import load_dataset_info
from lathe.llm.strict_files import load_json, load_yaml
from tests.llm.runs import lora_sft_config


def test_duplicate_yaml_key_names_key_file_and_both_lines(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("stage: sft\nlearning_rate: 1.0e-4\ndataset: a\nlearning_rate: 5.0e-5\n")
    with pytest.raises(ValueError) as error:
        parse_train_config(str(path))
    message = str(error.value)
    assert str(path) in message and "'learning_rate'" in message
    assert "line 2 and line 4" in message and "keep the last" in message


def test_yaml_merge_key_may_be_overridden_and_nested_duplicates_are_caught():
    assert load_yaml("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\n", "f.yaml")["other"] == {"x": 3, "y": 2}
    with pytest.raises(ValueError, match=r"'x' is written twice \(line 2 and line 3\)"):
        load_yaml("outer:\n  x: 1\n  x: 2\n", "f.yaml")


def test_duplicate_json_key_in_dataset_info(tmp_path):
    text = '{\n  "a": {"file_name": "a.json"},\n  "b": {"file_name": "b.json"},\n  "a": {"file_name": "c.json"}\n}\n'
    (tmp_path / "dataset_info.json").write_text(text)
    with pytest.raises(ValueError) as error:
        load_dataset_info(str(tmp_path))
    message = str(error.value)
    assert "dataset_info.json" in message and "'a'" in message and "line 2 and line 4" in message
    # The same key in two different objects is no duplicate.
    assert load_json('{"a": {"x": 1}, "b": {"x": 2}}', "f.json") == {"a": {"x": 1}, "b": {"x": 2}}
    with pytest.raises(ValueError, match=r"'x' is written twice \(line 3 and line 4\)"):
        load_json('{"a": [1, {"x": "x"}],\n "b": {\n  "x": 1,\n  "x": 2}}', "f.json")


def test_duplicate_key_in_json_train_config(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"stage": "sft"})[:-1] + ',\n"stage": "pt"}')
    with pytest.raises(ValueError, match=r"'stage' is written twice \(line 1 and line 2\)"):
        parse_train_config(str(path))


def test_unknown_template_suggests_the_close_name_not_all_121():
    from lathe.llm.templates.registry import TEMPLATES, get_template

    with pytest.raises(ValueError) as error:
        get_template("qwen3_nothnk")
    message = str(error.value)
    assert message.startswith("Unknown template 'qwen3_nothnk': did you mean 'qwen3_nothink'")
    assert "alpaca" not in message and f"{len(TEMPLATES)} in all" in message
    with pytest.raises(ValueError, match="known ones include aeva, alpaca"):
        get_template("zzzz")


# ---- End to end on the tiny Llama (conftest.py): a few CPU steps each.


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """20 short alpaca rows and 20 tool-call conversations, registered in dataset_info.json."""
    folder = tmp_path_factory.mktemp("first_day_data")
    rows = [
        {"instruction": f"What is {a} plus 2?", "input": "", "output": f"{a} plus 2 is {a + 2}."} for a in range(20)
    ]
    (folder / "add.json").write_text(json.dumps(rows))
    # Half the rows have a long question: cutoff_len 16 leaves their answer no token (LLaMA-Factory's split).
    long = " ".join(["What is two plus two?"] * 30)
    mixed = [
        {"instruction": long if i % 2 else "hi", "input": "", "output": "Two plus two is four."} for i in range(20)
    ]
    (folder / "mixed.json").write_text(json.dumps(mixed))
    (folder / "dataset_info.json").write_text(
        json.dumps({"add": {"file_name": "add.json"}, "mixed": {"file_name": "mixed.json"}})
    )
    return str(folder)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.getbasetemp() / "home"))  # the tokenization cache


def _losses(output_dir):
    lines = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    return [line["loss"] for line in lines if "loss" in line]


@pytest.mark.slow
def test_saved_run_config_runs_as_it_is_and_reproduces_the_losses(tiny_model_dir, data_dir, tmp_path, write_yaml):
    from lathe.llm.commands import train_command

    config = write_yaml(tmp_path / "train.yaml", lora_sft_config(tiny_model_dir, data_dir, tmp_path / "first"))
    assert train_command(config, ["learning_rate=5e-3"]) == 0
    saved = tmp_path / "first" / "lathe_train_config.yaml"
    import yaml

    values = yaml.safe_load(saved.read_text())
    assert values["learning_rate"] == 5e-3 and values["template"] == "chatml"  # flat keys, the override kept
    assert train_command(str(saved), [f"output_dir={tmp_path / 'again'}"]) == 0
    first, again = _losses(tmp_path / "first"), _losses(tmp_path / "again")
    assert len(first) == 2 and first == again


@pytest.mark.slow
def test_rerun_into_a_finished_run_rewrites_nothing_and_a_resume_names_changed_keys(
    tiny_model_dir, data_dir, tmp_path, write_yaml, capsys, caplog
):
    from lathe.llm.commands import train_command

    output = tmp_path / "run"
    config = write_yaml(tmp_path / "train.yaml", lora_sft_config(tiny_model_dir, data_dir, output, save_steps=2))
    assert train_command(config, []) == 0
    names = (
        "train_results.json",
        "all_results.json",
        "trainer_state.json",
        "trainer_log.jsonl",
        "lathe_train_config.yaml",
    )
    before = {name: (output / name).read_bytes() for name in names}
    assert json.loads(before["train_results.json"])["train_loss"] > 0
    capsys.readouterr()

    assert train_command(config, ["learning_rate=2e-3"]) == 0
    out = capsys.readouterr().out
    assert f"run in {output} already finished at step 2; nothing to do" in out
    assert "learning_rate: 0.002 (from the config) != 0.001 (from lathe_train_config.yaml)" in out
    assert {name: (output / name).read_bytes() for name in names} == before

    # Raising max_steps continues the run from checkpoint-2, with the changed key named as transformers does.
    with caplog.at_level("WARNING"):
        assert train_command(config, ["max_steps=3"]) == 0
    assert "max_steps: 3 (from the config) != 2 (from lathe_train_config.yaml)" in caplog.text
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == 3


@pytest.mark.slow
def test_a_cutoff_that_leaves_rows_untrained_keeps_them_with_a_warning(
    tiny_model_dir, data_dir, tmp_path, write_yaml, caplog
):
    """LLaMA-Factory keeps rows cutoff_len leaves with no trained token (its configs run unchanged); lathe keeps
    them too and says how many."""
    import logging

    from lathe.llm.commands import train_command

    # max_dropped_rows_share 1.0: this cutoff also cuts most trained tokens, which stops a run unless opted out
    values = lora_sft_config(
        tiny_model_dir, data_dir, tmp_path / "out", dataset="mixed", cutoff_len=16, max_dropped_rows_share=1.0
    )
    config = write_yaml(tmp_path / "train.yaml", values)
    with caplog.at_level(logging.WARNING, logger="lathe.llm.data"):
        assert train_command(config, [], dry_run=True) == 0
    assert "kept 10 of 20 examples with no trained token left after truncation to cutoff_len=16" in caplog.text
    assert "left out" not in caplog.text


def test_chat_reads_the_template_of_a_folder_lathe_exported(tiny_model_dir, tmp_path):
    import shutil

    from lathe.llm.export import export_model
    from lathe.llm.inference.config import parse_infer_config
    from lathe.llm.inference.loading import load_tokenizer_and_template

    for name in ("chatml", "llama3"):
        values = {"model_name_or_path": tiny_model_dir, "template": name, "finetuning_type": "full"}
        export_model(parse_infer_config({**values, "export_dir": str(tmp_path / name)}, command="export"))
        _, template = load_tokenizer_and_template(
            parse_infer_config({"model_name_or_path": str(tmp_path / name)}, command="chat")
        )
        assert template.name == name

    # A chat_template lathe cannot read: the error speaks of chatting, not of training.
    folder = tmp_path / "unreadable"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        load_tokenizer_and_template(parse_infer_config({"model_name_or_path": str(folder)}, command="chat"))
    message = str(error.value)
    assert f"cannot read the chat_template of {folder} to chat with it" in message
    assert "Set `template`" in message and "train" not in message


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
    {  # a bare description (no "type": "function" wrapper), an enum and an array argument
        "name": "pick",
        "parameters": {
            "type": "object",
            "properties": {
                "mode": {"type": "string", "enum": ["fast", "slow"], "description": "how"},
                "ids": {"type": "array", "items": {"type": "integer"}},
            },
        },
    },
]


@pytest.mark.parametrize("name", ["qwen", "qwen3", "bailing_v2", "chatml", "default"])
@pytest.mark.parametrize("arguments", [{"a": 2, "b": 4}, '{"a": 2, "b": 4}'])
def test_the_exported_chat_template_renders_tools_as_training_did(tiny_tokenizer_dir, name, arguments):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from lathe.llm.templates import get_template_and_fix_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    data_args = SimpleNamespace(template=name, tool_format=None, default_system=None, enable_thinking=True)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    tokenizer.chat_template = template.jinja_chat_template(tokenizer)  # what export writes
    call = {"type": "function", "function": {"name": "add", "arguments": arguments}}
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is 2 plus 4?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "6"},
    ]
    turns = [
        {"role": "user", "content": "what is 2 plus 4?"},
        {"role": "function", "content": json.dumps([{"name": "add", "arguments": {"a": 2, "b": 4}}])},
        {"role": "observation", "content": "6"},
        {"role": "assistant", "content": "2 plus 4 is 6."},
    ]
    prompt_ids, answer_ids = template.encode_oneturn(tokenizer, turns, "be brief", json.dumps(TOOLS))
    rendered = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, return_dict=True)
    assert list(rendered["input_ids"]) == prompt_ids
    whole = messages + [{"role": "assistant", "content": "2 plus 4 is 6."}]
    rendered = tokenizer.apply_chat_template(whole, tools=TOOLS, return_dict=True)
    assert list(rendered["input_ids"])[: len(prompt_ids) + len(answer_ids)] == prompt_ids + answer_ids


def test_export_says_when_its_chat_template_cannot_render_tools(tiny_model_dir, tmp_path, caplog):
    from lathe.llm.export import export_model
    from lathe.llm.inference.config import parse_infer_config

    for name, renders in (("llama3", False), ("chatml", True)):
        values = {"model_name_or_path": tiny_model_dir, "template": name, "finetuning_type": "full"}
        caplog.clear()
        with caplog.at_level("WARNING", logger="lathe.llm"):
            export_model(parse_infer_config({**values, "export_dir": str(tmp_path / name)}, command="export"))
        warned = "The exported chat_template does not render tools: tool_format 'llama3' of template 'llama3'"
        assert (warned in caplog.text) is not renders
