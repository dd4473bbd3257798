"""How raw config values become field values: reading the YAML/JSON file, `key=value` overrides,
the key checks (unknown, not supported yet) and conversion to each field's type, with the YAML
1.1 surprises smoothed over (`no` read as False, `1e-3` read as a string)."""

from __future__ import annotations

import copy
import logging
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Literal, Union

from lathe.llm.config.keys import (
    ANY_VALUE,
    REFUSED_KEYS,
    TRL_GRPO_NOT_IMPLEMENTED,
    UNSUPPORTED_KEYS,
    applies_nothing,
    refusal_reason,
)
from lathe.llm.strict_files import DuplicateKeyError, did_you_mean, load_json, load_yaml

logger = logging.getLogger(__name__)

__all__ = [
    "read_source",
    "parse_overrides",
    "check_keys",
    "coerce_value",
    "split_commas",
    "RawConfig",
    "build_sections",
]

NULL_WORDS = ("null", "None", "~")
# YAML 1.1 reads an unquoted `no` as False; these fields take the string "no".
STRATEGY_KEYS = ("eval_strategy", "save_strategy", "logging_strategy", "evaluation_strategy", "hub_strategy")


def split_commas(value: Any) -> Any:
    """LLaMA-Factory's comma lists: "a, b" -> ["a", "b"]; lists and None pass through."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def read_source(source: str | Path | dict) -> tuple[dict[str, Any], str | None]:
    """(the mapping, the file path or None for a dict)."""
    if isinstance(source, dict):
        return dict(source), None
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"Config file {str(path)!r} not found.")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = load_json(text, str(path))
        except DuplicateKeyError:
            raise
        except ValueError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
    else:
        import yaml

        try:
            data = load_yaml(text, str(path))
        except yaml.YAMLError as error:
            raise ValueError(f"{path} is not valid YAML: {error}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(
            f"{path} must hold a mapping of keys to values (like `stage: sft`), not a {type(data).__name__}."
        )
    return {str(key): value for key, value in data.items()}, str(path)


class RawConfig:
    """A config file's values with the command-line overrides on top, and where each key came from."""

    def __init__(self, source: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()):
        file_values, self.path = read_source(source)
        self.from_command_line = parse_overrides(overrides)
        self.values = {**file_values, **self.from_command_line}
        self.where = f" (in {self.path})" if self.path else ""

    def origin(self, key: str) -> str:
        return " (command line)" if key in self.from_command_line else self.where

    def copy(self) -> RawConfig:
        """An independent copy (parsing pops and converts values): a command reads its file once, then each
        reader of the values (the launchers, parse_train_config) takes its own copy."""
        duplicate = copy.copy(self)
        duplicate.values, duplicate.from_command_line = copy.deepcopy(self.values), dict(self.from_command_line)
        return duplicate

    def coerce(self, known: dict[str, Any]) -> None:
        """Convert every value to its field's type (`known`: key -> type hint), naming the key on error."""
        for key in list(self.values):
            try:
                self.values[key] = coerce_value(key, self.values[key], known[key], key in self.from_command_line)
            except ValueError as error:
                raise ValueError(f"{error}{self.origin(key)}") from None


def build_sections(
    values: dict[str, Any], sections: dict[str, type], hints: dict[str, dict], where: str
) -> dict[str, Any]:
    """One dataclass per section from the keys that belong to it; their own checks name the file, and so
    do their warnings (which would otherwise point at this line: config_warnings says which are kept)."""
    built = {}
    for name, dtype in sections.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                built[name] = dtype(**{key: value for key, value in values.items() if key in hints[name]})
            except (TypeError, ValueError) as error:
                raise ValueError(f"{error}{where}") from None
        for message in config_warnings(caught):
            logger.warning("%s%s", message, where)
    return built


def config_warnings(caught) -> list[str]:
    """The messages of the warnings a config's dataclasses gave, once each. transformers 5's "was removed"
    notices are dropped: a LLaMA-Factory config spells warmup_ratio, evaluation_strategy, ... the 4.x way
    on purpose (LLaMA-Factory runs on transformers 4), and lathe reads those keys as it does."""
    kept = []
    for item in caught:
        message = str(item.message)
        if "was removed in transformers 5" in message or message in kept:
            continue
        kept.append(message)
    return kept


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`key=value`, `--key value`, `--key=value` and a bare `--flag` (true) into a dict of strings."""
    result: dict[str, str] = {}
    items = list(overrides)
    index = 0
    while index < len(items):
        item = items[index]
        index += 1
        if item.startswith("--"):
            key, equals, value = item[2:].partition("=")
            if not equals:
                if index < len(items) and not items[index].startswith("--"):
                    value = items[index]
                    index += 1
                else:
                    value = "true"
        else:
            key, equals, value = item.partition("=")
            if not equals:
                raise ValueError(f"Override {item!r} is not key=value (nor --key value).")
        key = key.strip().replace("-", "_")
        if not key:
            raise ValueError(f"Override {item!r} has no key.")
        result[key] = value
    return result


def check_keys(
    raw: dict[str, Any],
    known: list[str],
    origin,
    hints: dict[str, str] | None = None,
    unsupported: dict[str, tuple[str, object]] = UNSUPPORTED_KEYS,
) -> None:
    """Drop LLaMA-Factory keys that are set to LLaMA-Factory's default (they change nothing); raise
    one error listing unknown keys (with the closest known one) and keys not supported yet.
    `origin(key)` says where a key came from, for the message; `hints` maps keys that belong to
    another command to what to say about them."""
    _refuse_what_cannot_run(raw, origin)
    errors = []
    hints = hints or {}
    for key in list(raw):
        if key in unsupported:
            feature, default = unsupported[key]
            if raw[key] == default or (isinstance(raw[key], str) and raw[key] == str(default)):
                del raw[key]
            else:
                errors.append(
                    f"{key}{origin(key)} is a LLaMA-Factory key for {feature}, which lathe does not "
                    f"support yet (got {raw[key]!r})."
                )
        elif key in known:
            continue
        elif key in TRL_GRPO_NOT_IMPLEMENTED:
            default = TRL_GRPO_NOT_IMPLEMENTED[key]
            if raw[key] == default or (isinstance(raw[key], str) and raw[key] == str(default)):
                del raw[key]
            else:
                errors.append(
                    f"{key}{origin(key)} is a TRL GRPOConfig key that lathe's stage grpo does not implement yet "
                    f"(got {raw[key]!r}; TRL's default {default!r} is accepted)."
                )
        elif key in hints:
            errors.append(f"{key}{origin(key)} {hints[key]}")
        else:
            errors.append(f"Unknown key {key!r}{origin(key)}{did_you_mean(key, known)}")
    if errors:
        raise ValueError("\n".join(errors))


def _refuse_what_cannot_run(raw: dict[str, Any], origin) -> None:
    """The first key (in file order) asking for what cannot run here stops the run, with one line saying
    why; such keys left at LLaMA-Factory's default change nothing and are dropped."""
    for key in [key for key in raw if key in REFUSED_KEYS]:
        default, value = REFUSED_KEYS[key][0], raw[key]
        if default is not ANY_VALUE and (
            value == default or (isinstance(value, str) and value.lower() == str(default).lower())
        ):
            del raw[key]
            continue
        nothing = applies_nothing(key, value)
        if nothing is not None:
            logger.warning(nothing)
            del raw[key]
            continue
        raise ValueError(f"{key}{origin(key)}: {refusal_reason(key)}")


def _members(hint: Any) -> tuple[list[Any], bool]:
    """(the non-None members of a type hint, whether None is allowed)."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = typing.get_args(hint)
        return [a for a in args if a is not type(None)], type(None) in args
    return [hint], False


def _to_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        from lathe.train.args.parser import string_to_bool

        try:
            return string_to_bool(value)
        except Exception:
            return None
    return None


def _to_number(key: str, value: Any, integer: bool) -> int | float | None:
    """The number `value` stands for (None when it is not one); an int field refuses fractions.
    An int given for a float field stays an int (val_size: 100 means 100 examples)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)  # "1e-3", which PyYAML leaves as a string
            except ValueError:
                return None
    if not isinstance(value, (int, float)):
        return None
    if integer and isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{key}: expected an integer, got {value!r}")
        return int(value)
    return value


def coerce_value(key: str, value: Any, hint: Any, from_command_line: bool) -> Any:
    """`value` (from YAML or the command line) converted to the field's type `hint`; raises a
    ValueError naming the key when it cannot be."""
    members, nullable = _members(hint)
    if value is None:
        if nullable or not members or any(m is Any for m in members):
            return None
        raise ValueError(f"{key}: expected {_expected(members)}, got null (leave the key out for its default)")
    if isinstance(value, str) and nullable and value in NULL_WORDS and (from_command_line or str not in members):
        return None
    if key in STRATEGY_KEYS and value is False:
        return "no"
    scalar = _scalar(key, value, members)
    if scalar is not _NOT_A_SCALAR:
        return scalar
    if members == [str] and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # `template: 1` or `dataset: 2024` mean the names
    is_list = any(m is list or typing.get_origin(m) is list for m in members)
    if from_command_line and isinstance(value, str) and is_list and str not in members:
        return split_commas(value)
    if not _fits(value, members):
        raise ValueError(f"{key}: expected {_expected(members)}, got {value!r}")
    return value


_NOT_A_SCALAR = object()


def _scalar(key: str, value: Any, members: list[Any]) -> Any:
    """`value` as the Literal choice, bool or number the type allows, _NOT_A_SCALAR when the type
    also allows what `value` is (a string, a list); a ValueError when nothing fits."""
    literal = next((m for m in members if typing.get_origin(m) is Literal), None)
    if literal is not None:
        if value in typing.get_args(literal):
            return value
        if len(members) == 1:
            raise ValueError(f"{key}: expected one of {list(typing.get_args(literal))}, got {value!r}")
    if bool in members:
        converted = _to_bool(value)
        if converted is not None:
            return converted
        if str not in members:
            raise ValueError(f"{key}: expected true or false, got {value!r}")
    if int in members or float in members:
        number = _to_number(key, value, integer=float not in members)
        if number is not None:
            return number
        if str not in members:
            raise ValueError(f"{key}: expected a number, got {value!r}")
    return _NOT_A_SCALAR


def _fits(value: Any, members: list[Any]) -> bool:
    """Whether `value` has one of the member types (containers by their outer type; Any takes anything)."""
    for member in members:
        origin = typing.get_origin(member) or member
        if member is Any or origin is Literal:
            return True
        if (
            isinstance(origin, type)
            and isinstance(value, origin)
            and not (isinstance(value, bool) and origin is not bool)
        ):
            return True
    return False


def _expected(members: list[Any]) -> str:
    names = {
        str: "a string",
        bool: "true or false",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "a mapping",
    }
    described = [
        names.get(typing.get_origin(member) or member, getattr(member, "__name__", str(member))) for member in members
    ]
    return " or ".join(dict.fromkeys(described))
