"""TrainingArguments checks its numeric and boolean fields once, at construction: strings are read as
HfArgumentParser reads them from a command line, a value of the wrong type is an error naming the
field (transformers stores it and fails later with "'<' not supported ..."). Also: save_steps=0
with save_strategy="steps", and an output_dir that is an existing file."""

from __future__ import annotations

import math

import pytest

from lathe import HfArgumentParser
from lathe.train.args.training_args import Seq2SeqTrainingArguments, TrainingArguments
from tests.train import crash_worker


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("per_device_train_batch_size", "8", 8),
        ("max_steps", "3", 3),
        ("learning_rate", "1e-3", 1e-3),
        ("num_train_epochs", "2", 2.0),
        ("save_total_limit", "2", 2),
        ("warmup_steps", "0.1", 0.1),
        ("use_cpu", "true", True),
        ("disable_tqdm", "no", False),
        ("tf32", "False", False),
        ("seed", " 7 ", 7),
    ],
)
def test_strings_are_read_as_the_argument_parser_reads_them(tmp_path, name, text, expected):
    args = TrainingArguments(output_dir=str(tmp_path), **{name: text})
    assert getattr(args, name) == expected and type(getattr(args, name)) is type(expected)
    (parsed,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), f"--{name}", text.strip()], look_for_args_file=False
    )
    assert getattr(parsed, name) == getattr(args, name)


def test_quoted_numbers_in_a_config_file_are_numbers(tmp_path):
    config = tmp_path / "args.yaml"
    config.write_text(
        f"output_dir: {tmp_path}\nmax_steps: '3'\nlearning_rate: 1e-3\nper_device_train_batch_size: '4'\n"
    )
    (args,) = HfArgumentParser(TrainingArguments).parse_yaml_file(str(config))
    assert (args.max_steps, args.learning_rate, args.per_device_train_batch_size) == (
        3,
        1e-3,
        4,
    )  # YAML reads 1e-3 as a string


@pytest.mark.parametrize(
    "name, value, error",
    [
        ("per_device_train_batch_size", "eight", ValueError),
        ("max_steps", "3.5", ValueError),
        ("learning_rate", "fast", ValueError),
        ("num_train_epochs", [1], TypeError),
        ("per_device_train_batch_size", None, TypeError),
        ("learning_rate", None, TypeError),
        ("max_steps", 3.5, ValueError),
        ("seed", 1.5, ValueError),
        ("gradient_accumulation_steps", True, TypeError),
        ("fp16", "maybe", ValueError),
        ("fp16", 2, TypeError),
        ("learning_rate", math.nan, ValueError),
        ("warmup_steps", math.inf, ValueError),
        ("num_train_epochs", "inf", ValueError),
        ("save_total_limit", "two", ValueError),
        ("logging_steps", {"every": 5}, TypeError),
        ("dataloader_num_workers", "2 workers", ValueError),
    ],
)
def test_a_value_of_the_wrong_type_is_an_error_naming_the_field(tmp_path, name, value, error):
    with pytest.raises(error) as raised:
        TrainingArguments(output_dir=str(tmp_path), **{name: value})
    assert name in str(raised.value)


def test_numbers_keep_their_type_and_a_whole_float_in_an_int_field_becomes_an_int(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=3.0, num_train_epochs=3, learning_rate=1, max_grad_norm=math.inf
    )
    assert type(args.max_steps) is int and args.max_steps == 3
    assert (
        type(args.num_train_epochs) is int and type(args.learning_rate) is int
    )  # as given, as transformers keeps them
    assert args.max_grad_norm == math.inf  # a norm that is logged and never clips
    assert TrainingArguments(output_dir=str(tmp_path), use_cpu=1).use_cpu is True


def test_subclass_fields_are_checked_too(tmp_path):
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), generation_max_length="64", predict_with_generate="yes")
    assert args.generation_max_length == 64 and args.predict_with_generate is True
    with pytest.raises(ValueError, match="generation_num_beams"):
        Seq2SeqTrainingArguments(output_dir=str(tmp_path), generation_num_beams="four")


def test_save_steps_zero_with_the_steps_strategy_is_an_error(tmp_path):
    # transformers accepts it and then never saves.
    with pytest.raises(ValueError, match="save_strategy='steps' needs a positive save_steps"):
        TrainingArguments(output_dir=str(tmp_path), save_strategy="steps", save_steps=0)
    assert TrainingArguments(output_dir=str(tmp_path), save_strategy="epoch", save_steps=0).save_steps == 0
    # An unset eval_steps (None or 0) follows logging_steps, as in transformers.
    assert (
        TrainingArguments(output_dir=str(tmp_path), eval_strategy="steps", eval_steps=0, logging_steps=7).eval_steps
        == 7
    )
    with pytest.raises(ValueError, match="logging_steps"):
        TrainingArguments(output_dir=str(tmp_path), logging_steps=0)


def test_an_output_dir_that_is_a_file_is_an_error_naming_it(tmp_path):
    existing = tmp_path / "results.txt"
    existing.write_text("not a folder")
    with pytest.raises(ValueError, match=rf"output_dir='{existing}' is an existing file, not a folder"):
        TrainingArguments(output_dir=str(existing))
    # A file that appears after the arguments were made: the error comes when training starts.
    later = tmp_path / "later"
    trainer = crash_worker.build_trainer(str(later), {"args": {"max_steps": 2}})
    later.rmdir()  # the Trainer made it, as transformers' does; a file takes its place
    later.write_text("a file")
    with pytest.raises(ValueError, match=rf"output_dir='{later}' is an existing file"):
        trainer.train()
