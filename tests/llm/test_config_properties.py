"""`lathe train` config values at random (hypothesis): random values for known keys and random unknown keys,
from a file's mapping or from key=value overrides, are either accepted or a ValueError that names the key;
never another exception (a crash deep in the dataclasses, or a message that does not say which key)."""

import dataclasses
import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lathe.llm.config.train import (  # noqa: E402
    DataArguments,
    FinetuningArguments,
    GeneratingArguments,
    ModelArguments,
    parse_train_config,
    training_arguments_class,
)

SECTIONS = (ModelArguments, DataArguments, FinetuningArguments, GeneratingArguments, training_arguments_class())
KNOWN = sorted({field.name for section in SECTIONS for field in dataclasses.fields(section) if field.init})
# transformers-4 names lathe.train accepts and reports under their new name
RENAMED = {
    "evaluation_strategy": "eval_strategy",
    "no_cuda": "use_cpu",
    "gradient_checkpointing": "activation_checkpointing",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
}
BASE = {"model_name_or_path": "m", "dataset": "d", "output_dir": "out", "report_to": "none"}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)
SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5000)
    | st.floats(-2, 10)
    | st.sampled_from(
        [
            "",
            "no",
            "steps",
            "epoch",
            "auto",
            "true",
            "1e-3",
            "null",
            "lora",
            "full",
            "sft",
            "pt",
            "0",
            "-1",
            "cosine",
            "adamw_torch",
            "a,b",
            "all",
            "qwen",
            "fp16",
        ]
    )
)
KEYS = st.sampled_from(KNOWN) | st.from_regex(r"[a-z_][a-z0-9_]{0,14}", fullmatch=True)
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def check(values: dict, parse) -> None:
    try:
        parse()
    except ValueError as error:
        message = str(error)
        named = [key for key in values if key in message or RENAMED.get(key, key) in message]
        assert named, f"the error names none of {sorted(values)}: {message}"
        assert "Traceback" not in message


@pytest.mark.filterwarnings("ignore::FutureWarning")
@FUZZ
@given(values=st.dictionaries(KEYS, SCALAR | JSON, min_size=1, max_size=3))
def test_random_values_in_a_config_are_accepted_or_an_error_naming_the_key(values):
    check(values, lambda: parse_train_config({**BASE, **values}))


@pytest.mark.filterwarnings("ignore::FutureWarning")
@FUZZ
@given(values=st.dictionaries(KEYS, SCALAR | JSON, min_size=1, max_size=3))
def test_random_key_value_overrides_are_accepted_or_an_error_naming_the_key(values):
    overrides = [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in values.items()]
    check(values, lambda: parse_train_config(BASE, overrides))


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"num_train_epochs": None},
            "num_train_epochs: expected a number, got null (leave the key out for its default)",
        ),
        ({"lora_rank": None}, "lora_rank: expected an integer, got null"),
        ({"report_to": 0}, "report_to: expected a string or a list, got 0"),
        ({"include_for_metrics": False}, "include_for_metrics: expected a list, got False"),
        ({"logging_dir": True}, "logging_dir: expected a string, got True"),
        ({"do_eval": True}, "do_eval: evaluation or prediction needs data: set eval_dataset, or val_size"),
    ],
)
def test_values_of_the_wrong_kind_found_by_the_random_configs(values, message):
    # each was a TypeError deep in the dataclasses, or an error that named no key
    with pytest.raises(ValueError) as raised:
        parse_train_config({**BASE, **values})
    assert message in str(raised.value)
