"""Property-based tests (hypothesis) of what lathe.train reads from users: TrainingArguments values,
HfArgumentParser's dict / JSON / YAML / argv inputs, and the files of a checkpoint. Whatever comes
in, the result is accepted, or an error of the documented kind that names the field, key, option or
file; never another exception from deep inside. Examples are derandomized (the same ones every run,
so CI is reproducible) and few, so the file runs in a few seconds."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lathe import HfArgumentParser, TrainingArguments  # noqa: E402
from lathe.train.args.coercion import _checked_fields  # noqa: E402
from lathe.train.checkpoints import layout as ckpt  # noqa: E402
from tests.train import crash_worker  # noqa: E402

FUZZ = settings(
    max_examples=int(os.environ.get("LATHE_FUZZ_EXAMPLES", 100)),
    deadline=None,
    derandomize=not os.environ.get("LATHE_FUZZ_EXAMPLES"),
    database=None,
)

NUMERIC_AND_FLAG_FIELDS = sorted(_checked_fields(TrainingArguments))
CHOICE_FIELDS = [
    "eval_strategy",
    "logging_strategy",
    "save_strategy",
    "lr_scheduler_type",
    "optim",
    "log_level",
    "train_sampling_strategy",
    "include_num_input_tokens_seen",
]
FIELDS = NUMERIC_AND_FLAG_FIELDS + CHOICE_FIELDS

# Values a config file, a command line or a careless caller could give.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["3", "0", "-1", "1e-3", "0.5", "true", "no", "steps", "epoch", "nan", "inf", " 8 ", ""]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=5), scalars, max_size=2))


def quietly(build):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices are tested elsewhere
        return build()


def assert_accepted_or_named(name: str, value) -> None:
    with tempfile.TemporaryDirectory() as folder:
        try:
            args = quietly(lambda: TrainingArguments(output_dir=folder, **{name: value}))
        except (TypeError, ValueError) as error:
            assert name in str(error), f"{name}={value!r}: {error}"
            return
    kind = _checked_fields(TrainingArguments).get(name, (None,))[0]
    if kind is not None and getattr(args, name) is not None:  # what was accepted now has the field's type
        assert isinstance(getattr(args, name), (int, float) if kind is float else kind)


@FUZZ
@given(name=st.sampled_from(NUMERIC_AND_FLAG_FIELDS), value=values)
def test_any_value_of_a_numeric_or_flag_field_is_accepted_or_an_error_naming_it(name, value):
    assert_accepted_or_named(name, value)


@FUZZ
@given(name=st.sampled_from(CHOICE_FIELDS), value=values)
def test_any_value_of_a_choice_field_is_accepted_or_an_error_naming_it(name, value):
    assert_accepted_or_named(name, value)


field_dicts = st.dictionaries(st.sampled_from(FIELDS + ["max_step", "lerning_rate"]), values, min_size=1, max_size=3)


def assert_names_a_key(error: Exception, keys) -> None:
    message = " ".join([str(error), *getattr(error, "__notes__", [])])
    assert any(str(key) in message for key in keys), f"{sorted(keys)}: {message}"


@FUZZ
@given(data=field_dicts, form=st.sampled_from(["dict", "json", "yaml"]))
def test_parsing_a_dict_json_or_yaml_file_accepts_or_names_a_key(data, form):
    parser = HfArgumentParser(TrainingArguments)
    with tempfile.TemporaryDirectory() as folder:
        data = {"output_dir": folder, **data}
        path = Path(folder) / f"args.{form}"
        try:
            if form == "dict":
                quietly(lambda: parser.parse_dict(data))
            elif form == "json":
                path.write_text(json.dumps(data))
                quietly(lambda: parser.parse_json_file(str(path)))
            else:
                path.write_text(yaml.safe_dump(data))
                quietly(lambda: parser.parse_yaml_file(str(path)))
        except (TypeError, ValueError) as error:
            assert_names_a_key(error, data)


@FUZZ
@given(text=st.text(max_size=60))
def test_any_yaml_file_is_parsed_or_a_clear_error(text):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "args.yaml"
        path.write_text(f"output_dir: {folder}\n{text}")
        try:
            quietly(lambda: HfArgumentParser(TrainingArguments).parse_yaml_file(str(path)))
        except (TypeError, ValueError) as error:
            message = " ".join([str(error), *getattr(error, "__notes__", [])])
            assert str(path) in message or "Unknown key" in message or any(f in message for f in FIELDS), message


@FUZZ
@given(
    name=st.sampled_from(FIELDS),
    text=st.one_of(st.text(max_size=10), st.sampled_from(["3", "1e-3", "yes", "steps", "-1"])),
)
def test_a_command_line_option_is_parsed_or_argparse_names_it(name, text):
    with tempfile.TemporaryDirectory() as folder:
        argv = ["--output_dir", folder, f"--{name}", text]
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                quietly(
                    lambda: HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
                        argv, look_for_args_file=False
                    )
                )
        except SystemExit as exit_:  # argparse's way: usage and the bad option on stderr, exit code 2
            assert exit_.code == 2 and f"--{name}" in stderr.getvalue(), stderr.getvalue()
        except (TypeError, ValueError) as error:
            # A value that looks like an option (e.g. "-x") is left over, and the error lists it, as in transformers.
            assert name in str(error) or repr(text) in str(error), str(error)


# ----- checkpoint files -----


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """checkpoint-2 of crash_worker's job with fp16 (so scaler.pt too)."""
    root = tmp_path_factory.mktemp("fuzz-checkpoint")
    crash_worker.build_trainer(
        str(root), {"args": {"max_steps": 2, "save_steps": 2, "save_total_limit": None, "fp16": True}}
    ).train()
    return root / "checkpoint-2"


CHECKPOINT_FILES = [
    "lathe_checkpoint.json",
    "model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
    "rng_state.pth",
    "trainer_state.json",
    "training_args.bin",
    "training_args.json",
]


@st.composite
def damaged_files(draw, sizes: dict):
    name = draw(st.sampled_from(CHECKPOINT_FILES))
    size = sizes[name]
    how = draw(st.sampled_from(["truncated", "random bytes", "random bytes of the same length"]))
    if how == "truncated":
        return name, how, draw(st.integers(min_value=0, max_value=size))
    length = size if how.endswith("same length") else draw(st.integers(min_value=0, max_value=2 * size))
    return name, how, draw(st.binary(min_size=length, max_size=length))


def damage(path: Path, how: str, change) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:change] if how == "truncated" else change)


@pytest.mark.parametrize("form", ["lathe", "transformers"])
def test_damaged_checkpoint_files_give_an_error_naming_the_file_or_a_skipped_checkpoint(form, pristine):
    sizes = {name: (pristine / name).stat().st_size for name in CHECKPOINT_FILES}

    @settings(FUZZ, max_examples=int(os.environ.get("LATHE_FUZZ_EXAMPLES", 45)))
    @given(damaged=damaged_files(sizes))
    def check(damaged):
        name, how, change = damaged
        with tempfile.TemporaryDirectory() as folder:
            output_dir = Path(folder)
            shutil.copytree(pristine, output_dir / "checkpoint-2")
            if form == "transformers":
                (output_dir / "checkpoint-2" / ckpt.MANIFEST_NAME).unlink()
                if name == ckpt.MANIFEST_NAME:
                    return
            damage(output_dir / "checkpoint-2" / name, how, change)
            found = ckpt.get_last_checkpoint(str(output_dir))  # never raises
            trainer = crash_worker.build_trainer(
                str(output_dir), {"args": {"max_steps": 2, "save_steps": 2, "fp16": True}}
            )
            try:
                trainer.train(resume_from_checkpoint=True)
            except ValueError as error:
                message = str(error)
                if found is None:
                    assert "holds no complete checkpoint-N folder" in message, message
                else:
                    assert name in message, f"{name} {how}: {message}"
                return
            assert found is not None
            torch.testing.assert_close(trainer.state.global_step, 2)

    check()
