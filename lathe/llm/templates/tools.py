"""Tool formats: how a template describes the available tools and writes tool calls (and reads them back).

The text each format produces is part of the training data, so it is byte for byte what LLaMA-Factory
0.9.5 writes for the same format name (`default`, `qwen`, `llama3`, `mistral`). A malformed tool list
or tool call raises `InvalidMessage`, which the supervised processor turns into a counted skip.
"""
from __future__ import annotations

import json
import re
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


def _unwrap(tool: dict) -> dict:
    """OpenAI style {"type": "function", "function": {...}} -> the inner function description."""
    return tool.get("function", "") if tool.get("type") == "function" else tool


def _wrap(tool: dict) -> dict:
    """A bare function description -> OpenAI style {"type": "function", "function": {...}}."""
    return tool if tool.get("type") == "function" else {"type": "function", "function": tool}


def _dump(value: Any, **kwargs) -> str:
    return json.dumps(value, ensure_ascii=False, **kwargs)


# ---- default: a ReAct-like "Action: / Action Input:" format, for templates without their own.
_DEFAULT_PROMPT = (
    "You have access to the following tools:\n{tool_text}"
    "Use the following format if using a tool:\n```\n"
    "Action: tool name (one of [{tool_names}])\n"
    "Action Input: the input to the tool, in a JSON format representing the kwargs "
    '(e.g. ```{{"input": "hello world", "num_beams": 5}}```)\n```\n'
)


def _describe_default(tools: list[dict]) -> str:
    blocks, names = [], []
    for tool in tools:
        tool = _unwrap(tool)
        lines = ""
        parameters = tool["parameters"]
        for name, param in parameters["properties"].items():
            required = ", required" if name in parameters.get("required", []) else ""
            enum = ", should be one of [{}]".format(", ".join(param["enum"])) if param.get("enum") else ""
            items = ""
            if param.get("items"):
                items = ", where each item should be {}".format(param["items"].get("type", ""))
            kind, description = param.get("type", ""), param.get("description", "")
            lines += f"  - {name} ({kind}{required}): {description}{enum}{items}\n"
        description = tool.get("description", "")
        blocks.append(f"> Tool Name: {tool['name']}\nTool Description: {description}\nTool Args:\n{lines}\n")
        names.append(tool["name"])
    return _DEFAULT_PROMPT.format(tool_text="".join(blocks), tool_names=", ".join(names))


def _format_default(calls: list[FunctionCall]) -> str:
    return "\n".join(f"Action: {call.name}\nAction Input: {call.arguments}" for call in calls)


_DEFAULT_ACTION = re.compile(r"Action:\s*([a-zA-Z0-9_]+)\s*Action Input:\s*(.+?)(?=\s*Action:|\s*$)", re.DOTALL)


def _extract_default(text: str):
    calls = []
    for name, arguments in _DEFAULT_ACTION.findall(text):
        try:
            parsed = json.loads(arguments.strip().strip('"').strip("```"))
        except json.JSONDecodeError:
            return text
        calls.append(FunctionCall(name.strip(), _dump(parsed)))
    return calls or text


# ---- qwen (Qwen2.5): <tools> block in the system message, <tool_call> JSON in the answer.
_QWEN_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, '
    '"arguments": <args-json-object>}}\n</tool_call>'
)


def _describe_qwen(tools: list[dict]) -> str:
    return _QWEN_PROMPT.format(tool_text="".join("\n" + _dump(_wrap(tool)) for tool in tools))


def _format_qwen(calls: list[FunctionCall]) -> str:
    bodies = [_dump({"name": call.name, "arguments": json.loads(call.arguments)}) for call in calls]
    return "\n".join(f"<tool_call>\n{body}\n</tool_call>" for body in bodies)


_QWEN_CALL = re.compile(r"<tool_call>(.+?)</tool_call>(?=\s*<tool_call>|\s*$)", re.DOTALL)


def _extract_qwen(text: str):
    calls = []
    for body in _QWEN_CALL.findall(text):
        try:
            call = json.loads(body.strip())
        except json.JSONDecodeError:
            return text
        if not isinstance(call, dict) or "name" not in call or "arguments" not in call:
            return text
        calls.append(FunctionCall(call["name"], _dump(call["arguments"])))
    return calls or text


# ---- llama3 (Llama 3.x JSON tool calling, tools in the system message).
_LLAMA3_PROMPT = (
    "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n"
    "You have access to the following functions. To call a function, please respond with JSON for a function call. "
    'Respond in the format {{"name": function name, "parameters": dictionary of argument name and its value}}. '
    "Do not use variables.\n\n{tool_text}"
)


def _describe_llama3(tools: list[dict]) -> str:
    tool_text = "".join(_dump(_wrap(tool), indent=4) + "\n\n" for tool in tools)
    return _LLAMA3_PROMPT.format(date=today(), tool_text=tool_text)


def _format_llama3(calls: list[FunctionCall]) -> str:
    objects = [{"name": call.name, "parameters": json.loads(call.arguments)} for call in calls]
    return _dump(objects[0] if len(objects) == 1 else objects)


def _extract_json_calls(text: str, arguments_key: str):
    try:
        parsed = json.loads(text.strip())
    except json.JSONDecodeError:
        return text
    parsed = parsed if isinstance(parsed, list) else [parsed]
    try:
        return [FunctionCall(call["name"], _dump(call[arguments_key])) for call in parsed]
    except (KeyError, TypeError):
        return text


# ---- mistral (v0.3 tokenizer): [AVAILABLE_TOOLS] JSON list, [TOOL_CALLS] JSON list.
def _describe_mistral(tools: list[dict]) -> str:
    return "[AVAILABLE_TOOLS] " + _dump([_wrap(tool) for tool in tools]) + "[/AVAILABLE_TOOLS]"


def _format_mistral(calls: list[FunctionCall]) -> str:
    return _dump([{"name": call.name, "arguments": json.loads(call.arguments)} for call in calls])


TOOL_FORMATS = {
    "default": ToolFormat("default", _describe_default, _format_default, _extract_default),
    "qwen": ToolFormat("qwen", _describe_qwen, _format_qwen, _extract_qwen),
    "llama3": ToolFormat("llama3", _describe_llama3, _format_llama3, lambda t: _extract_json_calls(t, "parameters")),
    "mistral": ToolFormat("mistral", _describe_mistral, _format_mistral, lambda t: _extract_json_calls(t, "arguments")),
}


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
        raise InvalidMessage(f"tools must be a JSON list of tool descriptions, got {type(parsed).__name__} {tools[:40]!r}")
    try:
        return get_tool_format(tool_format).describe_tools(parsed)
    except (KeyError, TypeError, AttributeError) as error:
        raise InvalidMessage(f"a tool description lacks a field or has the wrong type ({error!r}): each tool needs a "
                             '"name" and JSON-schema "parameters" with "properties"') from None


def _parse_calls(text: str) -> list[FunctionCall]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidMessage(f"function call is not valid JSON ({error.msg})") from None
    except RecursionError:
        raise InvalidMessage("function call nests JSON too deeply") from None
    parsed = parsed if isinstance(parsed, list) else [parsed]  # a list is a parallel call
    try:
        return [FunctionCall(call["name"], _dump(call["arguments"])) for call in parsed]
    except (KeyError, TypeError):
        raise InvalidMessage('function call needs "name" and "arguments"') from None


def _first_enclosed(text: str, words: tuple[str, str] | None) -> "re.Match | None":
    if not words or len(words) != 2:
        return None
    return re.search(f"{re.escape(words[0])}(.*?){re.escape(words[1])}", text, re.DOTALL)


def format_function_message(content: str, tool_format: str, thought_words=None, tool_call_words=None) -> str:
    """An assistant tool-call message (JSON calls, optionally with a thought or text around a tool-call
    block) -> the text the model is trained to write. Text outside the tool-call block is kept before the
    calls, as LLaMA-Factory does (every occurrence of the matched block is removed from it)."""
    formatter = get_tool_format(tool_format)
    try:  # arguments nested deeply enough to parse may still be too deep to write back
        block = _first_enclosed(content, tool_call_words)
        if block is not None:
            return content.replace(block.group(0), "") + formatter.format_calls(_parse_calls(block.group(1)))
        thought = _first_enclosed(content, thought_words)
        calls_text = content.replace(thought.group(0), "") if thought else content
        formatted = formatter.format_calls(_parse_calls(calls_text))
    except RecursionError:
        raise InvalidMessage("function call nests JSON too deeply") from None
    return thought.group(0) + formatted if thought else formatted
