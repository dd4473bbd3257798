"""The types of TrainingArguments' numeric and boolean fields, checked once at construction: a string
(what a command line or a config file gives) is converted as HfArgumentParser converts it, anything
else of the wrong type is an error naming the field."""

from __future__ import annotations

import math
import numbers
import types
import typing
from dataclasses import fields
from functools import lru_cache

_TRUE_STRINGS = ("yes", "true", "t", "y", "1")
_FALSE_STRINGS = ("no", "false", "f", "n", "0")
_CHECKED = (int, float, bool)
# Where infinity means something: clipping to an infinite norm computes and logs the norm, clips nothing.
_INFINITY_ALLOWED = ("max_grad_norm",)
# Where transformers refuses a float even when whole (e.g. 1.0), so lathe does too.
_INTEGER_ONLY = ("torch_empty_cache_steps",)


def coerce_field_types(args) -> None:
    """Make every int / float / bool field (optional or not) hold a value of its type, or raise a
    TypeError or ValueError naming the field. Strings are read as argparse would read them
    ("3" -> 3, "1e-3" -> 0.001, "true" -> True); a whole float in an int field becomes an int;
    numbers already of the field's type are left as they are."""
    for name, (kind, optional) in _checked_fields(type(args)).items():
        value = getattr(args, name)
        if value is None:
            if not optional:
                raise TypeError(f"{name} must be {_describe(kind)}, got None")
            continue
        converted = _convert(name, value, kind)
        if converted is not value:
            setattr(args, name, converted)


@lru_cache(maxsize=None)
def _checked_fields(cls) -> dict:
    """name -> (int | float | bool, whether None is allowed), for the fields of those types."""
    hints = {}
    # A user subclass whose annotations do not resolve: check the fields of the nearest base whose do
    # (TrainingArguments itself), found on the class rather than imported (training_args.py imports this module).
    for base in cls.__mro__:
        try:
            hints = typing.get_type_hints(base)
            break
        except Exception:
            continue
    checked = {}
    for field in fields(cls):
        hint = hints.get(field.name)
        members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        kinds = [member for member in members if member is not type(None)]
        if len(kinds) == 1 and kinds[0] in _CHECKED:
            checked[field.name] = (kinds[0], len(kinds) < len(members))
    return checked


def _convert(name: str, value, kind):
    if isinstance(value, str):
        return _from_string(name, value, kind)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, numbers.Integral) and value in (0, 1):
            return bool(value)  # YAML and JSON configs sometimes write flags as 0 / 1
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {_describe(kind)}, got {value!r} ({type(value).__name__})")
    if kind is int:
        if name in _INTEGER_ONLY and not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return _whole(name, value)
    _check_finite(name, value)
    return value if isinstance(value, (int, float)) else float(value)  # numpy scalars become Python numbers


def _from_string(name: str, text: str, kind):
    cleaned = text.strip()
    if kind is bool:
        if cleaned.lower() in _TRUE_STRINGS:
            return True
        if cleaned.lower() in _FALSE_STRINGS:
            return False
        raise ValueError(f"{name} must be True or False (yes/no, true/false, t/f, y/n, 1/0), got {text!r}")
    try:
        number = kind(cleaned)
    except ValueError:
        raise ValueError(f"{name} must be {_describe(kind)}, got {text!r}") from None
    if kind is float:
        _check_finite(name, number)
    return number


def _check_finite(name: str, value) -> None:
    if math.isnan(value) or (math.isinf(value) and name not in _INFINITY_ALLOWED):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _whole(name: str, value) -> int:
    if isinstance(value, numbers.Integral):
        return value if type(value) is int else int(value)
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(value)


def _describe(kind) -> str:
    return {int: "an integer", float: "a number", bool: "True or False"}[kind]
