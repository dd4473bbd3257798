"""Reading and running tool calls in GRPO: a tool's JSON schema (transformers' get_json_schema), a generated
turn parsed into an assistant message with tool calls by a lathe tool format (lathe.llm.templates.tools), the
string arguments cast to the types the schema declares, and the calls run (a failure is the model's to read)."""

from __future__ import annotations

import asyncio
import inspect
import json
import math

# Tool-call markers of chat templates -> the lathe tool format that reads those calls (first match wins).
CHAT_TEMPLATE_MARKERS = (
    ("<function=", "qwen3_5"),
    ("<tool_call>", "qwen"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|tool_call>", "gemma4"),
)


def tool_schemas(tools) -> list[dict]:
    """The JSON schemas transformers builds from each tool's signature and docstring (get_json_schema)."""
    from transformers.utils import get_json_schema

    schemas = []
    for tool in tools:
        try:
            schemas.append(get_json_schema(tool))
        except Exception as error:  # transformers' DocstringParsingException / TypeHintParsingException
            name = getattr(tool, "__name__", repr(tool))
            raise ValueError(
                f"tools: {name!r} cannot be described as a JSON schema ({error}); give it type hints and a "
                "Google-style docstring with an Args section."
            ) from None
    return schemas


def guess_tool_format(tokenizer) -> str:
    chat_template = getattr(tokenizer, "chat_template", None)
    if not isinstance(chat_template, str):
        raise ValueError("tools: the tokenizer has no chat template to render tools with; set `template:`.")
    for marker, name in CHAT_TEMPLATE_MARKERS:
        if marker in chat_template:
            return name
    raise ValueError(
        "tools: cannot tell from the tokenizer's chat template how the model writes tool calls; set tool_format "
        "(one of lathe's tool formats, e.g. qwen) or `template:`."
    )


def _typed(raw: str, types: list):
    """A string argument as the first of its schema's types it reads as (transformers' response parsing casts
    the same way): whole numbers for integer, numbers, booleans (true/false/1/0), null, JSON objects and arrays;
    otherwise the string itself."""
    text = raw.strip()
    for kind in types:
        try:
            if kind == "integer" and float(text).is_integer():
                return int(float(text))
            if kind == "number" and math.isfinite(float(text)):
                return int(text) if "." not in text and float(text).is_integer() else float(text)
            if kind == "boolean" and text.lower() in ("true", "1", "false", "0"):
                return text.lower() in ("true", "1")
            if kind == "null" and text in ("null", "None"):
                return None
            if kind in ("object", "array") and isinstance(json.loads(text), dict if kind == "object" else list):
                return json.loads(text)
        except ValueError:
            continue
    return raw


def _schema_types(schema: dict) -> list:
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else [t for t in declared or [] if isinstance(t, str)]
    for choice in (schema.get("anyOf") or []) + (schema.get("oneOf") or []):
        types += _schema_types(choice) if isinstance(choice, dict) else []
    return types + (["null"] if schema.get("nullable") and "null" not in types else [])


def typed_arguments(name: str, arguments: dict, tools) -> dict:
    """Each string argument cast to the type the called tool's JSON schema declares for it ("7" -> 7 for an
    integer), as TRL's parsing does when it is given the tools."""
    schemas = {schema["function"]["name"]: schema["function"] for schema in tool_schemas(tools or [])}
    properties = schemas.get(name, {}).get("parameters", {}).get("properties", {})
    return {
        key: _typed(value, _schema_types(properties[key])) if isinstance(value, str) and key in properties else value
        for key, value in arguments.items()
    }


def parse_completion(tokenizer, ids, tool_format: str, tools=None) -> dict:
    """An assistant message from generated ids: its tool calls ({"type": "function", "function": {"name",
    "arguments"}}, the arguments typed by `tools`' schemas) and the text before them, or its text when it calls
    nothing (or a call does not parse)."""
    from lathe.llm.templates.tools import get_tool_format

    text = tokenizer.decode(ids, skip_special_tokens=False)
    eos = tokenizer.eos_token or ""
    while eos and text.endswith(eos):
        text = text[: -len(eos)]
    calls = get_tool_format(tool_format).extract_calls(text)
    if isinstance(calls, str) or not calls:
        return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}
    tool_calls = []
    for call in calls:
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError:
            return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}
        if not isinstance(call.name, str) or not isinstance(arguments, dict):
            return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}
        arguments = typed_arguments(call.name, arguments, tools)
        tool_calls.append({"type": "function", "function": {"name": call.name, "arguments": arguments}})
    return {"role": "assistant", "content": "", "tool_calls": tool_calls}


def call_tools(tool_calls, tools_by_name) -> tuple[list[tuple[str, object]], int]:
    """Each call's (name, result), a failing call's result {"error": message}; and how many failed."""
    results, failures = [], 0
    for call in tool_calls:
        if call.get("type") != "function":
            failures += 1
            results.append((call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call.get('type')}"}))
            continue
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        try:
            if name not in tools_by_name:
                raise ValueError(f"Tool {name} not found.")
            result = tools_by_name[name](**arguments)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
            results.append((name, result))
        except Exception as error:  # the model's call failed: the model reads the error, training goes on
            failures += 1
            results.append((name, {"error": str(error)}))
    return results, failures


async def _awaited(result):
    return await result
