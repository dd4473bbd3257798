"""Tests for lathe.train.args.parser: dataclass fields <-> argv, dict, JSON and YAML."""

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Optional, Union

import pytest

from lathe.train.args.parser import ArgumentParser, HfArgumentParser, string_to_bool


class Color(str, Enum):
    RED = "red"
    BLUE = "blue"


class Level(Enum):  # not a str enum: the parser must hand back the member, not the string
    LOW = 1
    HIGH = 2


@dataclass
class Basic:
    model_name: str  # required
    learning_rate: float = 1e-3
    num_layers: int = 2
    use_cache: bool = True
    do_eval: bool = False
    maybe_flag: Optional[bool] = None
    seed: Optional[int] = None
    color: Color = Color.RED
    mode: Literal["fast", "slow"] = "fast"
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    tags: Optional[list[str]] = None


@dataclass
class Unions:
    report_to: Union[None, str, list[str]] = "none"
    tokens_seen: Union[str, bool] = "no"
    strategy: Union[Color, str] = "red"
    kwargs: Union[dict, str, None] = None
    config: Optional[dict] = None
    level: Optional[Level] = None
    pep604: int | None = None
    sharding: Optional[str] = field(default=None, metadata={"nargs": "?", "const": True})
    old_name: Optional[int] = field(default=None, metadata={"deprecated": "pep604", "help": "Old; 10% slower."})


@dataclass
class Other:
    _argument_group_name = "other arguments"
    other_value: str = field(default="x", metadata={"aliases": ["-o"], "choices": ["x", "y"]})


def parse(dtype, argv):
    (result,) = HfArgumentParser(dtype).parse_args_into_dataclasses(argv, look_for_args_file=False)
    return result


def test_alias_and_constructor_forms():
    assert ArgumentParser is HfArgumentParser
    assert HfArgumentParser([Basic, Other]).dataclass_types == [Basic, Other]
    assert HfArgumentParser(Basic).dataclass_types == [Basic]


def test_defaults_and_required_field():
    assert parse(Basic, ["--model_name", "m"]) == Basic(model_name="m")
    with pytest.raises(SystemExit):
        parse(Basic, [])


def test_dashes_and_underscores_are_both_accepted():
    a = parse(Basic, ["--model_name", "m", "--learning_rate", "0.5", "--num-layers", "4"])
    b = parse(Basic, ["--model-name", "m", "--learning-rate", "0.5", "--num_layers", "4"])
    assert a == b and a.learning_rate == 0.5 and a.num_layers == 4


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--do_eval"], True),
        (["--do_eval", "true"], True),
        (["--do_eval", "yes"], True),
        (["--do_eval", "1"], True),
        (["--do_eval", "False"], False),
        (["--do_eval", "no"], False),
        (["--do_eval", "0"], False),
    ],
)
def test_bool_flag_forms(argv, expected):
    assert parse(Basic, ["--model_name", "m", *argv]).do_eval is expected


def test_no_flag_only_for_bools_defaulting_to_true():
    assert parse(Basic, ["--model_name", "m", "--no_use_cache"]).use_cache is False
    assert parse(Basic, ["--model_name", "m", "--no-use-cache"]).use_cache is False
    assert parse(Basic, ["--model_name", "m", "--use_cache", "false"]).use_cache is False
    with pytest.raises(ValueError, match="--no_do_eval"):
        parse(Basic, ["--model_name", "m", "--no_do_eval"])


def test_bad_bool_value_exits():
    with pytest.raises(SystemExit):
        parse(Basic, ["--model_name", "m", "--do_eval", "maybe"])


def test_optional_bool_takes_a_value_as_in_transformers():
    assert parse(Basic, ["--model_name", "m"]).maybe_flag is None
    assert parse(Basic, ["--model_name", "m", "--maybe_flag", "yes"]).maybe_flag is True
    assert parse(Basic, ["--model_name", "m", "--maybe_flag", "no"]).maybe_flag is False
    with pytest.raises(SystemExit):  # unset Optional[bool]: a bare flag is an error in transformers too
        parse(Basic, ["--model_name", "m", "--maybe_flag"])


def test_enum_and_literal_choices():
    result = parse(Basic, ["--model_name", "m", "--color", "blue", "--mode", "slow"])
    # as transformers: the option gives the member's value; a dataclass that wants the member converts it
    assert result.color == "blue" and result.mode == "slow"
    assert parse(Basic, ["--model_name", "m"]).color == Color.RED
    assert parse(Unions, ["--level", "2"]).level == Level.HIGH.value  # the value, as transformers gives
    for bad in (["--color", "green"], ["--mode", "medium"]):
        with pytest.raises(SystemExit):
            parse(Basic, ["--model_name", "m", *bad])
    with pytest.raises(SystemExit):
        parse(Unions, ["--level", "3"])


def test_lists_take_several_values():
    result = parse(Basic, ["--model_name", "m", "--sizes", "3", "4", "5", "--tags", "a", "b"])
    assert result.sizes == [3, 4, 5] and result.tags == ["a", "b"]
    with pytest.raises(SystemExit):
        parse(Basic, ["--model_name", "m", "--sizes", "x"])


def test_str_or_list_takes_one_or_several_values():
    assert parse(Unions, ["--report_to", "tensorboard", "jsonl"]).report_to == ["tensorboard", "jsonl"]
    assert parse(Unions, ["--report_to", "tensorboard"]).report_to == "tensorboard"
    assert parse(Unions, []).report_to == "none"


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], "no"),
        (["--tokens_seen", "non_padding"], "non_padding"),
        (["--tokens_seen"], True),
        (["--tokens_seen", "true"], True),
        (["--tokens_seen", "false"], False),
    ],
)
def test_str_or_bool_keeps_other_strings(argv, expected):
    assert parse(Unions, argv).tokens_seen == expected


def test_str_unions_take_the_string():
    result = parse(Unions, ["--strategy", "blue", "--kwargs", '{"a": 1}', "--config", '{"b": 2}'])
    assert result.strategy == "blue" and type(result.strategy) is str
    assert result.kwargs == '{"a": 1}'
    assert result.config == {"b": 2}
    with pytest.raises(SystemExit):
        parse(Unions, ["--strategy", "green"])
    with pytest.raises(SystemExit):
        parse(Unions, ["--config", "[1, 2]"])


def test_pep604_optional_and_deprecated_field():
    assert parse(Unions, ["--pep604", "3", "--old_name", "4"]) == Unions(pep604=3, old_name=4)


def test_argparse_metadata_is_passed_on():
    assert parse(Unions, ["--sharding"]).sharding is True
    assert parse(Unions, ["--sharding", "full"]).sharding == "full"


def test_unsupported_union_is_rejected_at_construction():
    @dataclass
    class Bad:
        value: Union[int, float] = 1

    with pytest.raises(ValueError, match="value"):
        HfArgumentParser(Bad)


def test_help_renders_groups_help_text_and_percent_signs():
    text = HfArgumentParser([Unions, Other]).format_help()
    assert "other arguments" in text and "10% slower" in text and "[deprecated: use --pep604]" in text
    options = text[text.index("options:") :]
    assert options.index("other arguments") < options.index("deprecated arguments") < options.index("--old_name")


def test_a_help_that_is_not_a_string_parses_as_in_transformers():
    """run_fim.py (transformers' examples, v4.49) gives a field a tuple as help (a trailing comma): transformers hands
    it to argparse unchanged, so parsing works and only --help fails; lathe used to fail at construction."""

    @dataclass
    class TupleHelp:
        pad_to_multiple_of: bool = field(default=False, metadata={"help": ("Whether to pad. ", "A multiple of 8.")})

    parser = HfArgumentParser(TupleHelp)
    (parsed,) = parser.parse_args_into_dataclasses(["--pad_to_multiple_of", "true"], look_for_args_file=False)
    assert parsed.pad_to_multiple_of is True
    with pytest.raises(AttributeError):  # transformers' parser: the same AttributeError from argparse
        parser.format_help()


def test_remaining_strings_raise_or_come_back():
    parser = HfArgumentParser(Basic)
    with pytest.raises(ValueError, match=r"--learnig_rate.*\n.*did you mean '--learning_rate'"):
        parser.parse_args_into_dataclasses(["--model_name", "m", "--learnig_rate", "1"], look_for_args_file=False)
    result, remaining = parser.parse_args_into_dataclasses(
        ["--model_name", "m", "--unknown", "1"], return_remaining_strings=True, look_for_args_file=False
    )
    assert result == Basic(model_name="m") and remaining == ["--unknown", "1"]


def test_several_dataclasses_and_extra_namespace():
    parser = HfArgumentParser([Basic, Other])
    parser.add_argument("--extra", type=int, default=7)
    basic, other, extra = parser.parse_args_into_dataclasses(
        ["--model_name", "m", "--other_value", "y"], look_for_args_file=False
    )
    assert basic.model_name == "m" and other.other_value == "y" and extra.extra == 7
    assert parser.parse_args_into_dataclasses(["--model_name", "m", "-o", "y"], look_for_args_file=False)[1] == other
    with pytest.raises(SystemExit):  # metadata choices apply
        parser.parse_args_into_dataclasses(["--model_name", "m", "-o", "z"], look_for_args_file=False)


def test_args_files(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    (tmp_path / "train.args").write_text("--model_name from_script  # a comment\n--num_layers 3\n")
    monkeypatch.setattr(sys, "argv", [str(script), "--num_layers", "5"])
    parser = HfArgumentParser(Basic)
    (result,) = parser.parse_args_into_dataclasses()
    assert result.model_name == "from_script" and result.num_layers == 5  # the command line wins

    named = tmp_path / "named.args"
    named.write_text("--model_name 'with space'")
    (result,) = parser.parse_args_into_dataclasses([], args_filename=str(named))
    assert result.model_name == "with space" and result.num_layers == 2  # train.args not read

    flagged = tmp_path / "flagged.args"
    flagged.write_text("--model_name flagged --num_layers 9 --seed 1")
    (result,) = parser.parse_args_into_dataclasses(
        ["--args-file", str(flagged), "--seed", "2"], look_for_args_file=False, args_file_flag="--args-file"
    )
    assert (result.model_name, result.num_layers, result.seed) == ("flagged", 9, 2)


@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_file_and_dict_round_trips(tmp_path, suffix):
    import yaml

    original = Basic(model_name="m", learning_rate=0.25, use_cache=False, sizes=[7], tags=["t"], mode="slow")
    data = dataclasses.asdict(original)
    data["color"] = original.color.value  # files hold plain values
    parser = HfArgumentParser(Basic)
    assert parser.parse_dict(data) == (original,)
    path = tmp_path / f"config.{suffix}"
    path.write_text(json.dumps(data) if suffix == "json" else yaml.safe_dump(data))
    reader = parser.parse_json_file if suffix == "json" else parser.parse_yaml_file
    assert reader(path) == (original,)


def test_dict_values_go_straight_to_the_constructor():
    (result,) = HfArgumentParser(Unions).parse_dict({"tokens_seen": True, "report_to": ["a"]})
    assert result.tokens_seen is True and result.report_to == ["a"]


def test_unknown_keys_name_each_key_and_suggest(tmp_path):
    parser = HfArgumentParser([Basic, Other])
    with pytest.raises(ValueError) as error:
        parser.parse_dict({"model_name": "m", "learnig_rate": 1, "zzz": 2})
    message = str(error.value)
    assert "Unknown key 'learnig_rate'; did you mean 'learning_rate'?" in message
    assert "Unknown key 'zzz'" in message
    assert parser.parse_dict({"model_name": "m", "zzz": 2}, allow_extra_keys=True)[0] == Basic(model_name="m")

    path = tmp_path / "config.yaml"
    path.write_text("model_name: m\nlearnig_rate: 0.1\n")
    with pytest.raises(ValueError, match=f"Unknown key 'learnig_rate' in {path}; did you mean 'learning_rate'"):
        parser.parse_yaml_file(path)
    json_path = tmp_path / "config.json"
    json_path.write_text('{"model_name": "m", "other_valu": 1}')
    with pytest.raises(ValueError, match=f"in {json_path}; did you mean 'other_value'"):
        parser.parse_json_file(json_path)


def test_yaml_path_in_parse_errors(tmp_path):
    parser = HfArgumentParser(Basic)
    broken = tmp_path / "broken.yaml"
    broken.write_text("model_name: [unclosed\n")
    with pytest.raises(ValueError, match="broken.yaml"):
        parser.parse_yaml_file(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="list.yaml"):
        parser.parse_yaml_file(listing)


def test_string_to_bool():
    assert string_to_bool("Yes") is True and string_to_bool("F") is False and string_to_bool(True) is True
    with pytest.raises(argparse.ArgumentTypeError):
        string_to_bool("perhaps")


def test_no_torch_import():
    import subprocess

    code = "import sys, lathe.train.args.parser; assert 'torch' not in sys.modules and 'yaml' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


TRAINING_ARGV = [
    "--output_dir",
    "o",
    "--report_to",
    "tensorboard",
    "jsonl",
    "--include_num_input_tokens_seen",
    "non_padding",
    "--learning_rate",
    "1e-3",
]


def test_training_arguments_parse():
    args_module = pytest.importorskip("lathe.train.args.training_args")
    (args,) = HfArgumentParser(args_module.TrainingArguments).parse_args_into_dataclasses(
        TRAINING_ARGV, look_for_args_file=False
    )
    assert args.output_dir == "o" and args.learning_rate == 1e-3
    assert list(args.report_to) == ["tensorboard", "jsonl"]
    assert args.include_num_input_tokens_seen == "non_padding"


HF_CASES = [
    ["--model_name", "m"],
    ["--model-name", "m", "--learning-rate", "0.1", "--num_layers", "3"],
    ["--model_name", "m", "--no_use_cache", "--do_eval"],
    ["--model_name", "m", "--use_cache", "false", "--do_eval", "yes"],
    ["--model_name", "m", "--color", "blue", "--mode", "slow", "--seed", "3"],
    ["--model_name", "m", "--sizes", "4", "5", "--tags", "x", "y", "z"],
    ["--model_name", "m", "--maybe_flag", "True"],
]


# Basic again: transformers' parser rewrites `Field.type` of the dataclass it is given.
@dataclass
class HfBasic:
    model_name: str
    learning_rate: float = 1e-3
    num_layers: int = 2
    use_cache: bool = True
    do_eval: bool = False
    maybe_flag: Optional[bool] = None
    seed: Optional[int] = None
    color: Color = Color.RED
    mode: Literal["fast", "slow"] = "fast"
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    tags: Optional[list[str]] = None


@pytest.mark.hf
@pytest.mark.parametrize("argv", HF_CASES)
def test_matches_transformers(argv):
    hf_argparser = pytest.importorskip("transformers.hf_argparser")

    (theirs,) = hf_argparser.HfArgumentParser(HfBasic).parse_args_into_dataclasses(argv, look_for_args_file=False)
    ours = parse(Basic, argv)
    assert dataclasses.asdict(theirs) == dataclasses.asdict(ours)


@pytest.mark.hf
def test_options_are_the_argparse_options_transformers_makes():
    """Each option's argparse settings (type, nargs, const, default, choices, the `--no_*` twin) as transformers'."""
    hf_argparser = pytest.importorskip("transformers.hf_argparser")
    ours, theirs = HfArgumentParser(Basic)._actions, hf_argparser.HfArgumentParser(HfBasic)._actions
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs):
        mine, reference = dict(vars(mine)), dict(vars(reference))
        for settings in (mine, reference):
            settings.pop("container")
            convert = settings.pop("type")
            choices = settings["choices"]
            settings["type"] = [convert(str(c)) for c in choices] if choices else getattr(convert, "__name__", None)
        assert mine == reference


@pytest.mark.hf
def test_dict_parsing_matches_transformers():
    hf_argparser = pytest.importorskip("transformers.hf_argparser")
    data = {"model_name": "m", "use_cache": False, "color": "blue", "sizes": [3]}
    assert hf_argparser.HfArgumentParser(HfBasic).parse_dict(data) == HfArgumentParser(HfBasic).parse_dict(data)


@pytest.mark.hf
@pytest.mark.slow
def test_transformers_training_arguments_quirks_are_fixed():
    # HF's own parser rejects this argv: it reads report_to as one string and
    # include_num_input_tokens_seen as a bool.
    transformers = pytest.importorskip("transformers")
    (args,) = HfArgumentParser(transformers.TrainingArguments).parse_args_into_dataclasses(
        TRAINING_ARGV, look_for_args_file=False
    )
    assert args.report_to == ["tensorboard", "jsonl"] and args.learning_rate == 1e-3
    assert args.include_num_input_tokens_seen == "non_padding"
