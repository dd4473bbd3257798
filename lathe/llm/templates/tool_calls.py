"""The vocabulary every tool format shares: a function call, the format record, and JSON helpers.

A tool format says how a template describes the available tools (text appended to the system message),
writes tool calls into an answer, and reads them back from generated text. The formats themselves live
in tool_formats_json.py and tool_formats_xml.py; tools.py registers them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, NamedTuple


class InvalidMessage(ValueError):
    """A message or tool list that cannot be encoded (e.g. tool-call JSON that does not parse)."""


class FunctionCall(NamedTuple):
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class ToolFormat:
    name: str
    describe_tools: Callable[[list[dict[str, Any]]], str]  # tool list -> text appended to the system message
    format_calls: Callable[[list[FunctionCall]], str]  # calls -> the assistant's tool-call text
    extract_calls: Callable[[str], "str | list[FunctionCall]"]  # generated text -> calls (or the text itself)


def today() -> str:
    """The date the llama3 tool prompt states. A function so that tests can pin it."""
    return datetime.now().strftime("%d %b %Y")


def unwrap(tool: dict) -> dict:
    """OpenAI style {"type": "function", "function": {...}} -> the inner function description."""
    return tool.get("function", "") if tool.get("type") == "function" else tool


def wrap(tool: dict) -> dict:
    """A bare function description -> OpenAI style {"type": "function", "function": {...}}."""
    return tool if tool.get("type") == "function" else {"type": "function", "function": tool}


def dump(value: Any, **kwargs) -> str:
    return json.dumps(value, ensure_ascii=False, **kwargs)


def value_text(value: Any) -> str:
    """An argument value as the tag-per-argument formats write it: strings raw, anything else as JSON."""
    return value if isinstance(value, str) else dump(value)


def parse_value(text: str, raw: str) -> Any:
    """Reading back a value written by `value_text`: JSON where it parses, else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return raw
