"""Tool formats by name, and the two places templates use them: the tool descriptions appended to the
system message, and an assistant's tool-call message turned into the text the model is trained to write.

The formats (tool_formats_json.py, tool_formats_xml.py) write byte for byte what LLaMA-Factory 0.9.5
writes for the same name. A malformed tool list or tool call raises `InvalidMessage`, which the
supervised processor turns into a counted skip.
"""

from __future__ import annotations

import json
import re

from lathe.llm.templates import tool_formats_json, tool_formats_xml
from lathe.llm.templates.tool_calls import FunctionCall, InvalidMessage, ToolFormat, dump

__all__ = [
    "FunctionCall",
    "InvalidMessage",
    "TOOL_FORMATS",
    "describe_tools",
    "format_function_message",
    "get_tool_format",
]

TOOL_FORMATS: dict[str, ToolFormat] = {fmt.name: fmt for fmt in tool_formats_json.FORMATS + tool_formats_xml.FORMATS}


def get_tool_format(name: str) -> ToolFormat:
    if name not in TOOL_FORMATS:
        raise ValueError(f"Unknown tool_format {name!r}; available: {', '.join(sorted(TOOL_FORMATS))}.")
    return TOOL_FORMATS[name]


def describe_tools(tool_format: str, tools: str) -> str:
    """The `_tools` JSON string -> the text appended to the system message ("" for an empty list)."""
    try:
        parsed = json.loads(tools)
    except json.JSONDecodeError as error:
        raise InvalidMessage(f"tools are not valid JSON ({error.msg})") from None
    except RecursionError:
        raise InvalidMessage("tools nest JSON too deeply") from None
    if isinstance(parsed, (list, dict)) and len(parsed) == 0:
        return ""
    if not isinstance(parsed, list):
        raise InvalidMessage(
            f"tools must be a JSON list of tool descriptions, got {type(parsed).__name__} {tools[:40]!r}"
        )
    try:
        return get_tool_format(tool_format).describe_tools(parsed)
    except (KeyError, TypeError, AttributeError) as error:
        raise InvalidMessage(
            f"a tool description lacks a field or has the wrong type ({error!r}): each tool needs a "
            '"name" and JSON-schema "parameters" with "properties"'
        ) from None


def _parse_calls(text: str) -> list[FunctionCall]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidMessage(f"function call is not valid JSON ({error.msg})") from None
    except RecursionError:
        raise InvalidMessage("function call nests JSON too deeply") from None
    parsed = parsed if isinstance(parsed, list) else [parsed]  # a list is a parallel call
    try:
        return [FunctionCall(call["name"], dump(call["arguments"])) for call in parsed]
    except (KeyError, TypeError):
        raise InvalidMessage('function call needs "name" and "arguments"') from None


def _first_enclosed(text: str, words: tuple[str, str] | None) -> "re.Match | None":
    if not words or len(words) != 2:
        return None
    return re.search(f"{re.escape(words[0])}(.*?){re.escape(words[1])}", text, re.DOTALL)


def _format_calls(formatter: ToolFormat, calls: list[FunctionCall]) -> str:
    try:
        return formatter.format_calls(calls)
    except (AttributeError, TypeError, ValueError) as error:  # e.g. arguments that are not a JSON object
        if isinstance(error, InvalidMessage):
            raise
        raise InvalidMessage(f"the {formatter.name} tool format cannot write this call ({error})") from None


def format_function_message(content: str, tool_format: str, thought_words=None, tool_call_words=None) -> str:
    """An assistant tool-call message (JSON calls, optionally with a thought or text around a tool-call
    block) -> the text the model is trained to write. Text outside the tool-call block is kept before the
    calls, as LLaMA-Factory does (every occurrence of the matched block is removed from it)."""
    formatter = get_tool_format(tool_format)
    try:  # arguments nested deeply enough to parse may still be too deep to write back
        block = _first_enclosed(content, tool_call_words)
        if block is not None:
            return content.replace(block.group(0), "") + _format_calls(formatter, _parse_calls(block.group(1)))
        thought = _first_enclosed(content, thought_words)
        calls_text = content.replace(thought.group(0), "") if thought else content
        formatted = _format_calls(formatter, _parse_calls(calls_text))
    except RecursionError:
        raise InvalidMessage("function call nests JSON too deeply") from None
    return thought.group(0) + formatted if thought else formatted
