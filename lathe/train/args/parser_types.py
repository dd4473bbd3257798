"""What HfArgumentParser's options convert argv strings with (bools, choices, JSON objects), and HfArg."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterable
from typing import Any

DataClass = Any  # an instance of a dataclass
DataClassType = Any  # a dataclass type

_TRUE_STRINGS = ("yes", "true", "t", "y", "1")
_FALSE_STRINGS = ("no", "false", "f", "n", "0")


def string_to_bool(value: str | bool) -> bool:
    """Read yes/no, true/false, t/f, y/n, 1/0 (any case) as a bool; a bool passes through."""
    if isinstance(value, bool):
        return value
    if value.lower() in _TRUE_STRINGS:
        return True
    if value.lower() in _FALSE_STRINGS:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (yes/no, true/false, t/f, y/n, 1/0), got {value!r}")


def make_choice_type_function(choices: Iterable) -> Any:
    """The `type=` of a Literal or Enum option: the string a user types -> the choice it spells (e.g. "42" -> 42);
    a string that spells none stays as it is, for argparse's `choices` check to reject."""
    by_string = {str(choice): choice for choice in choices}
    return lambda text: by_string.get(text, text)


def HfArg(  # noqa: N802 - transformers' name
    *,
    aliases: str | list[str] | None = None,
    help: str | None = None,  # noqa: A002 - transformers' keyword
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
    metadata: dict | None = None,
    **kwargs,
) -> dataclasses.Field:
    """`dataclasses.field` with the parser's metadata as keywords: `aliases` (more option strings) and `help`."""
    metadata = dict(metadata or {})
    if aliases is not None:
        metadata["aliases"] = aliases
    if help is not None:
        metadata["help"] = help
    return dataclasses.field(metadata=metadata, default=default, default_factory=default_factory, **kwargs)


def string_or_bool(value: str | bool) -> str | bool:
    """For `Union[str, bool]` fields: true/false-like strings become bools, any other string stays a string."""
    try:
        return string_to_bool(value)
    except argparse.ArgumentTypeError:
        return value


def json_object(text: str) -> dict:
    """For `dict` fields: the command line can only carry a dict as JSON text."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value
