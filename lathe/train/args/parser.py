"""HfArgumentParser: dataclass fields become command-line options; argv, dicts, JSON and YAML fill dataclasses."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import shlex
import sys
import types
import typing
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union

from lathe.train.args.parser_types import (
    DataClass,
    DataClassType,
    HfArg,
    json_object,
    make_choice_type_function,
    string_or_bool,
    string_to_bool,
)

__all__ = [
    "ArgumentParser",
    "DataClass",
    "DataClassType",
    "HfArg",
    "HfArgumentParser",
    "make_choice_type_function",
    "string_to_bool",
]


class _StoreConverted(argparse.Action):
    """Store an option's value, converting it after argparse has checked `choices` on the raw strings.

    Conversion lives here rather than in `type=` because argparse runs `type` over a *string default*
    too: the default "no" of a `Union[str, bool]` field would silently become False, and an Enum
    field's string default would depend on how its choices happen to be spelled.
    """

    def __init__(self, option_strings, dest, convert=None, scalar_if_single=False, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.convert = convert or (lambda value: value)
        # `Union[str, list[X]]` fields: one value is the str member of the union (what a Python
        # caller would write, and what HF gives), several values are the list.
        self.scalar_if_single = scalar_if_single

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            if not isinstance(values, list):
                value = self.convert(values)
            elif self.scalar_if_single and len(values) == 1:
                value = values[0]
            else:
                value = [self.convert(item) for item in values]
        except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
            raise argparse.ArgumentError(self, str(error)) from None
        setattr(namespace, self.dest, value)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


def _is_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Enum)


def _is_list(hint: Any) -> bool:
    return hint is list or typing.get_origin(hint) is list


def _list_item(hint: Any) -> Any:
    arguments = typing.get_args(hint)
    return arguments[0] if arguments else str


def _choice_kwargs(hint: Any) -> dict[str, Any]:
    """A Literal or Enum option as transformers makes it: `choices` are the Literal's values (a tuple) or
    the members' values (a list), and the option gives that value, not the member (the dataclass converts)."""
    choices = typing.get_args(hint) if typing.get_origin(hint) is Literal else [member.value for member in hint]
    return {"type": make_choice_type_function(choices), "choices": choices}


def _argument_kwargs(field: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """The `add_argument` keywords (type/action, nargs, choices) that make argv strings into `hint` values."""
    nullable = False
    if _is_union(hint):
        members = [member for member in typing.get_args(hint) if member is not type(None)]
        nullable = len(members) < len(typing.get_args(hint))
        if str in members and len(members) > 1:
            others = [member for member in members if member is not str]
            lists = [member for member in others if _is_list(member)]
            enums = [member for member in others if _is_enum(member)]
            if lists:
                # HF drops the list and takes one string, so `--report_to a b` fails there.
                kwargs = _argument_kwargs(field, lists[0])
                kwargs.update(action=_StoreConverted, scalar_if_single=True)
                return kwargs
            if bool in others:
                # HF turns `Union[str, bool]` into bool and so rejects e.g. "non_padding".
                return {"action": _StoreConverted, "convert": string_or_bool, "nargs": "?", "const": True}
            if len(enums) == 1 and len(others) == 1:
                return _choice_kwargs(enums[0])
            # Union[dict, str] and friends: take the string; the dataclass's __post_init__ parses it.
            return {"type": str}
        if len(members) != 1:
            raise ValueError(
                f"Field {field.name!r} has type {hint}; a command-line option takes one type, so only "
                "Optional[X], Union[str, X] and Union[str, list[X]] are supported."
            )
        hint = members[0]

    if hint is bool:
        # "nullable_bool" is no argparse keyword: the caller pops it to pick the default and `--no_*`.
        return {"type": string_to_bool, "nargs": "?", "const": True, "nullable_bool": nullable}
    if typing.get_origin(hint) is Literal or _is_enum(hint):
        return _choice_kwargs(hint)
    if _is_list(hint):
        kwargs = _argument_kwargs(field, _list_item(hint))
        kwargs.pop("const", None)
        kwargs.pop("nullable_bool", None)
        kwargs["nargs"] = "+"
        return kwargs
    if hint is dict or typing.get_origin(hint) is dict:
        return {"type": json_object}
    if hint is Any or not callable(hint):
        return {"type": str}
    return {"type": hint}


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _help_of(field: dataclasses.Field) -> str | None:
    text = field.metadata.get("help")
    if "deprecated" in field.metadata:
        # The value names the replacing field, or is None when the option is simply ignored now.
        replacement = field.metadata["deprecated"]
        note = f"[deprecated: use --{replacement}]" if isinstance(replacement, str) else "[deprecated]"
        text = f"{text} {note}" if text else note
    # argparse %-formats help strings; a bare "%" (as in "10% of steps") would crash --help. A help that is not a
    # string (run_fim.py's is a tuple, from a trailing comma) goes to argparse as it is, as transformers passes it:
    # parsing works, only --help fails on it.
    return re.sub(r"%(?!\()", "%%", text) if isinstance(text, str) and text else text


def _init_field_names(dtype: type) -> list[str]:
    return [field.name for field in dataclasses.fields(dtype) if field.init]


def _unknown_keys_message(unknown: list[str], known: list[str], source: str | None) -> str:
    where = f" in {source}" if source else ""
    lines = []
    for key in unknown:
        closest = difflib.get_close_matches(str(key), known, n=1)
        suggestion = f"; did you mean {closest[0]!r}?" if closest else ""
        lines.append(f"Unknown key {key!r}{where}{suggestion}")
    return "\n".join(lines)


class HfArgumentParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose options come from the fields of one or more dataclasses.

    Each init field `name` becomes `--name` (and `--na-me` for names with underscores). Options added
    by hand after construction come back as an extra `argparse.Namespace` after the dataclasses.
    A dataclass with a `_argument_group_name` attribute gets its own help section.
    """

    def __init__(self, dataclass_types: type | Iterable[type] | None = None, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(**kwargs)
        if dataclass_types is None:
            dataclass_types = []
        elif dataclasses.is_dataclass(dataclass_types) or not isinstance(dataclass_types, Iterable):
            dataclass_types = [dataclass_types]
        self.dataclass_types = list(dataclass_types)
        deprecated = []
        for dtype in self.dataclass_types:
            deprecated += self._add_dataclass_arguments(dtype)
        if deprecated:
            # Deprecated options still parse but are listed last, so --help leads with current ones.
            group = self.add_argument_group(
                "deprecated arguments", "Still accepted; the dataclass warns and maps them to their replacement."
            )
            for field, hint in deprecated:
                self._add_field_argument(group, field, hint)

    def _add_dataclass_arguments(self, dtype: type) -> list[tuple[dataclasses.Field, Any]]:
        """Add the options of `dtype`'s current fields; return its deprecated fields, for the caller to add."""
        group_name = getattr(dtype, "_argument_group_name", None)
        container = self.add_argument_group(group_name) if group_name else self
        try:
            hints = typing.get_type_hints(dtype)
        except NameError as error:
            raise RuntimeError(
                f"Could not resolve the type hints of {dtype.__name__} ({error}). Declare the dataclass and "
                "the types it names at module level, or drop `from __future__ import annotations`."
            ) from error
        deprecated = []
        for field in dataclasses.fields(dtype):
            if not field.init:
                continue
            if "deprecated" in field.metadata:
                deprecated.append((field, hints[field.name]))
            else:
                self._add_field_argument(container, field, hints[field.name])
        return deprecated

    @staticmethod
    def _add_field_argument(container, field: dataclasses.Field, hint: Any) -> None:
        names = [f"--{field.name}"]
        if "_" in field.name:
            names.append(f"--{field.name.replace('_', '-')}")
        aliases = field.metadata.get("aliases", [])
        names += [aliases] if isinstance(aliases, str) else list(aliases)

        kwargs = _argument_kwargs(field, hint)
        nullable_bool = kwargs.pop("nullable_bool", None)
        is_bool = nullable_bool is not None
        # Explicit metadata wins over what the type implies, as in HF, whose TrainingArguments relies
        # on it (e.g. `fsdp` has nargs="?", const=True so a bare `--fsdp` works). Other metadata keys,
        # like "deprecated", are for the dataclass, and argparse would reject them.
        for key in ("choices", "metavar", "nargs", "const"):
            if key in field.metadata:
                kwargs[key] = field.metadata[key]

        default = _default_of(field)
        if is_bool and nullable_bool and default in (None, dataclasses.MISSING):
            # As in transformers: an unset Optional[bool] takes a value (`--opt true`), no bare `--opt`.
            for key in ("nargs", "const"):
                if key not in field.metadata:
                    kwargs.pop(key)
        if default is not dataclasses.MISSING:
            kwargs["default"] = default
        elif is_bool:
            # As in transformers: a bool without default is an off switch, Optional[bool] an unset one.
            kwargs["default"] = None if nullable_bool else False
        else:
            kwargs["required"] = True
        container.add_argument(*names, dest=field.name, help=_help_of(field), **kwargs)

        if is_bool and default is True:
            # After the positive option, which so owns the shared dest's default (argparse keeps the first).
            container.add_argument(
                f"--no_{field.name}",
                f"--no-{field.name.replace('_', '-')}",
                action="store_false",
                dest=field.name,
                default=False,
                help=_help_of(field),
            )

    def parse_args_into_dataclasses(
        self,
        args: list[str] | None = None,
        return_remaining_strings: bool = False,
        look_for_args_file: bool = True,
        args_filename: str | None = None,
        args_file_flag: str | None = None,
    ) -> tuple[Any, ...]:
        """Parse argv (default `sys.argv[1:]`) into one instance per dataclass type, in order.

        Args files hold options as on a command line (shell quoting and `#` comments allowed). Read in
        order, later ones winning: `args_filename`, or else `<script>.args` beside `sys.argv[0]` when
        `look_for_args_file`; then each file named by `args_file_flag` (e.g. "--args_file"); the
        command line itself comes last and so wins over all of them.

        Returns the dataclasses, then a Namespace of hand-added options if any, then the unparsed
        strings if `return_remaining_strings` (otherwise leftovers raise ValueError).
        """
        if args_file_flag or args_filename or (look_for_args_file and sys.argv and sys.argv[0]):
            args_files = []
            if args_filename:
                args_files.append(Path(args_filename))
            elif look_for_args_file and sys.argv and sys.argv[0]:
                args_files.append(Path(sys.argv[0]).with_suffix(".args"))
            if args_file_flag:
                flag_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
                flag_parser.add_argument(args_file_flag, dest="args_files", action="append", default=None)
                found, args = flag_parser.parse_known_args(args=args)
                args_files += [Path(path) for path in found.args_files or []]
            file_args = []
            for args_file in args_files:
                if args_file.exists():
                    file_args += shlex.split(args_file.read_text(encoding="utf-8"), comments=True)
            args = file_args + (sys.argv[1:] if args is None else list(args))

        namespace, remaining = self.parse_known_args(args=args)
        outputs: list[Any] = []
        for dtype in self.dataclass_types:
            inputs = {}
            for name in _init_field_names(dtype):
                if hasattr(namespace, name):
                    inputs[name] = getattr(namespace, name)
                    delattr(namespace, name)
            outputs.append(dtype(**inputs))
        if vars(namespace):
            outputs.append(namespace)
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            raise ValueError(self._remaining_strings_message(remaining))
        return tuple(outputs)

    def _remaining_strings_message(self, remaining: list[str]) -> str:
        lines = [f"Some specified arguments are not used by the HfArgumentParser: {remaining}"]
        options = [name for action in self._actions for name in action.option_strings]
        for token in remaining:
            if token.startswith("--"):
                closest = difflib.get_close_matches(token.split("=", 1)[0], options, n=1)
                if closest:
                    lines.append(f"{token!r}: did you mean {closest[0]!r}?")
        return "\n".join(lines)

    def parse_dict(self, args: dict[str, Any], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Build the dataclasses straight from a dict of field values; no argparse conversion involved."""
        return self._fill_dataclasses(args, allow_extra_keys, source=None)

    def parse_json_file(self, json_file, allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Build the dataclasses from a JSON file holding one object of field values."""
        return self._parse_file(json_file, json.loads, (ValueError,), allow_extra_keys)

    def parse_yaml_file(self, yaml_file, allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Build the dataclasses from a YAML file holding one mapping of field values (read with safe_load)."""
        import yaml  # deferred: ~20 ms, and only YAML users pay it

        return self._parse_file(yaml_file, yaml.safe_load, (yaml.YAMLError,), allow_extra_keys)

    def _parse_file(self, path, load, load_errors: tuple, allow_extra_keys: bool) -> tuple[Any, ...]:
        try:
            data = load(Path(path).read_text(encoding="utf-8"))
        except load_errors as error:
            raise ValueError(f"Could not parse {path}: {error}") from error
        if data is None:  # an empty file: every field keeps its default
            data = {}
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a mapping of argument names to values, not {type(data).__name__}")
        try:
            return self._fill_dataclasses(data, allow_extra_keys, source=str(path))
        except Exception as error:
            # A dataclass's own validation does not know which file the bad value came from.
            if hasattr(error, "add_note") and str(path) not in str(error):
                error.add_note(f"(while reading arguments from {path})")
            raise

    def _fill_dataclasses(self, values: dict[str, Any], allow_extra_keys: bool, source: str | None):
        names_per_type = [_init_field_names(dtype) for dtype in self.dataclass_types]
        if not allow_extra_keys:
            known = [name for names in names_per_type for name in names]
            unknown = [key for key in values if key not in known]
            if unknown:
                raise ValueError(_unknown_keys_message(unknown, known, source))
        return tuple(
            dtype(**{key: value for key, value in values.items() if key in names})
            for dtype, names in zip(self.dataclass_types, names_per_type)
        )


ArgumentParser = HfArgumentParser
