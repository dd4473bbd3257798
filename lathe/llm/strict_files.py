"""Reading the YAML and JSON files users write (configs, dataset_info.json) with a duplicate key an error,
and the one "did you mean" hint every config error uses."""

from __future__ import annotations

import difflib
import json
from typing import Any, Iterable

__all__ = ["DuplicateKeyError", "did_you_mean", "load_yaml", "load_json"]

# What LLaMA-Factory does with the same file, said in every duplicate-key error: its YAML (OmegaConf over
# PyYAML) and Python's json both keep the last value without a word.
PEER_KEEPS_LAST = "LLaMA-Factory would keep the last one without a word"


class DuplicateKeyError(ValueError):
    """A key written twice in one mapping of a user's file."""


def did_you_mean(word: str, choices: Iterable[str], cutoff: float = 0.6, n: int = 1) -> str:
    """The hint "; did you mean 'x'?" ("'x' or 'y'" for n > 1) naming the closest choices; "" when none is close."""
    matches = difflib.get_close_matches(word, list(choices), n=n, cutoff=cutoff)
    return f"; did you mean {' or '.join(repr(match) for match in matches)}?" if matches else ""


def _duplicate_message(key: str, path: str, first: int, second: int) -> str:
    return f"{path}: key {key!r} is written twice (line {first} and line {second}); {PEER_KEEPS_LAST}. Keep one."


def load_yaml(text: str, path: str) -> Any:
    """`yaml.safe_load` that refuses a key written twice in one mapping."""
    import yaml

    class _StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                # Only the keys written in this mapping: a `<<: *anchor` merge may be overridden on purpose.
                own = [key_node for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge"]
                seen: dict[Any, int] = {}
                for key_node in own:
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        if key in seen:
                            raise DuplicateKeyError(_duplicate_message(str(key), path, seen[key], line))
                        seen[key] = line
                    except TypeError:  # an unhashable key: PyYAML's own error follows
                        pass
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)


def load_json(text: str, path: str) -> Any:
    """`json.loads` that refuses a key written twice in one object, naming both lines."""

    def pairs_hook(pairs):
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise DuplicateKeyError(next(key for key in keys if keys.count(key) > 1))
        return dict(pairs)

    try:
        return json.loads(text, object_pairs_hook=pairs_hook)
    except DuplicateKeyError as error:
        key = str(error)
        first, second = _json_key_lines(text, key)
        raise DuplicateKeyError(_duplicate_message(key, path, first, second)) from None


def _json_key_lines(text: str, wanted: str) -> tuple[int, int]:
    """The lines of the first key `wanted` written twice in one object (the text is valid JSON). Only
    run after a duplicate was found, so a plain scan is fast enough."""
    frames: list[dict[str, int] | None] = []  # one per open object (its keys) or array (None)
    expect_key = False
    index = 0
    while index < len(text):
        char = text[index]
        if char == '"':
            value, end = json.decoder.scanstring(text, index + 1)
            if expect_key and frames and frames[-1] is not None:
                line = text.count("\n", 0, index) + 1
                if value == wanted and value in frames[-1]:
                    return frames[-1][value], line
                frames[-1][value] = line
                expect_key = False
            index = end
            continue
        if char == "{":
            frames.append({})
            expect_key = True
        elif char == "[":
            frames.append(None)
        elif char in "}]":
            frames.pop()
        elif char == ",":
            expect_key = bool(frames) and frames[-1] is not None
        index += 1
    return 0, 0
