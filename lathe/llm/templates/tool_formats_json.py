"""Tool formats whose calls are JSON objects: default (ReAct "Action:"), qwen, ling, llama3, mistral, glm4,
minimax1. The text each writes is byte for byte what LLaMA-Factory 0.9.5 writes for the same name."""

from __future__ import annotations

import json
import re

from lathe.llm.templates import tool_calls
from lathe.llm.templates.tool_calls import FunctionCall, InvalidMessage, ToolFormat, dump, unwrap, wrap

# ---- default: a ReAct-like "Action: / Action Input:" format, for templates without their own.
DEFAULT_PROMPT = (
    "You have access to the following tools:\n{tool_text}"
    "Use the following format if using a tool:\n```\n"
    "Action: tool name (one of [{tool_names}])\n"
    "Action Input: the input to the tool, in a JSON format representing the kwargs "
    '(e.g. ```{{"input": "hello world", "num_beams": 5}}```)\n```\n'
)


def _describe_default(tools: list[dict]) -> str:
    blocks, names = [], []
    for tool in tools:
        tool = unwrap(tool)
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
    return DEFAULT_PROMPT.format(tool_text="".join(blocks), tool_names=", ".join(names))


def _format_default(calls: list[FunctionCall]) -> str:
    return "\n".join(f"Action: {call.name}\nAction Input: {call.arguments}" for call in calls)


_DEFAULT_ACTION = re.compile(r"Action:\s*([a-zA-Z0-9_]+)\s*Action Input:\s*(.+?)(?=\s*Action:|\s*$)", re.DOTALL)


def _extract_default(text: str):
    calls = []
    for name, arguments in _DEFAULT_ACTION.findall(text):
        try:
            parsed = json.loads(arguments.strip().strip('"').strip("```"))  # noqa: B005 (backticks, as LLaMA-Factory strips them)
        except json.JSONDecodeError:
            return text
        calls.append(FunctionCall(name.strip(), dump(parsed)))
    return calls or text


# ---- qwen (Qwen2.5) and ling (Ling v2): <tools> block in the system message, <tool_call> JSON in the answer.
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, '
    '"arguments": <args-json-object>}}\n</tool_call>'
)


def _wrapped_lines(tools: list[dict]) -> str:
    return "".join("\n" + dump(wrap(tool)) for tool in tools)


def _describe_qwen(tools: list[dict]) -> str:
    return "\n\n" + TOOLS_BLOCK.format(tool_text=_wrapped_lines(tools))


def _describe_ling(tools: list[dict]) -> str:
    return TOOLS_BLOCK.format(tool_text=_wrapped_lines(tools)) + "\ndetailed thinking off"


def _format_qwen(calls: list[FunctionCall]) -> str:
    bodies = [dump({"name": call.name, "arguments": json.loads(call.arguments)}) for call in calls]
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
        calls.append(FunctionCall(call["name"], dump(call["arguments"])))
    return calls or text


# ---- llama3 (Llama 3.x JSON tool calling, tools in the system message).
_LLAMA3_PROMPT = (
    "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n"
    "You have access to the following functions. To call a function, please respond with JSON for a function call. "
    'Respond in the format {{"name": function name, "parameters": dictionary of argument name and its value}}. '
    "Do not use variables.\n\n{tool_text}"
)


def _describe_llama3(tools: list[dict]) -> str:
    tool_text = "".join(dump(wrap(tool), indent=4) + "\n\n" for tool in tools)
    return _LLAMA3_PROMPT.format(date=tool_calls.today(), tool_text=tool_text)


def _format_llama3(calls: list[FunctionCall]) -> str:
    objects = [{"name": call.name, "parameters": json.loads(call.arguments)} for call in calls]
    return dump(objects[0] if len(objects) == 1 else objects)


def _extract_json_calls(text: str, arguments_key: str):
    try:
        parsed = json.loads(text.strip())
    except json.JSONDecodeError:
        return text
    parsed = parsed if isinstance(parsed, list) else [parsed]
    try:
        return [FunctionCall(call["name"], dump(call[arguments_key])) for call in parsed]
    except (KeyError, TypeError):
        return text


# ---- mistral (v0.3 tokenizer): [AVAILABLE_TOOLS] JSON list, [TOOL_CALLS] JSON list.
def _describe_mistral(tools: list[dict]) -> str:
    return "[AVAILABLE_TOOLS] " + dump([wrap(tool) for tool in tools]) + "[/AVAILABLE_TOOLS]"


def _format_mistral(calls: list[FunctionCall]) -> str:
    return dump([{"name": call.name, "arguments": json.loads(call.arguments)} for call in calls])


# ---- glm4 (GLM-4 / ChatGLM3): a Chinese preamble, one call per answer as "name\n{arguments}".
_GLM4_PROMPT = (
    "你是一个名为 ChatGLM 的人工智能助手。你是基于智谱 AI 公司训练的语言模型 GLM-4 模型开发的，"
    "你的任务是针对用户的问题和要求提供适当的答复和支持。\n\n# 可用工具{tool_text}"
)


def _describe_glm4(tools: list[dict]) -> str:
    tool_text = ""
    for tool in tools:
        tool = unwrap(tool)
        tool_text += (
            f"\n\n## {tool['name']}\n\n{dump(tool, indent=4)}\n在调用上述函数时，请使用 Json 格式表示调用的参数。"
        )
    return _GLM4_PROMPT.format(tool_text=tool_text)


def _format_glm4(calls: list[FunctionCall]) -> str:
    if len(calls) > 1:
        raise InvalidMessage("the glm4 tool format does not support parallel function calls")
    return f"{calls[0].name}\n{calls[0].arguments}"


def _extract_glm4(text: str):
    if "\n" not in text:
        return text
    name, arguments = text.split("\n", maxsplit=1)
    try:
        return [FunctionCall(name, dump(json.loads(arguments.strip())))]
    except json.JSONDecodeError:
        return text


# ---- minimax1 (MiniMax-M1): <tools> JSON lines, calls as JSON lines inside <tool_calls>.
_MINIMAX1_PROMPT = (
    "You are provided with these tools:\n<tools>\n{tool_text}</tools>\n\n"
    "If you need to call tools, please respond with <tool_calls></tool_calls> XML tags, and provide tool-name and "
    "json-object of arguments, following the format below:\n<tool_calls>\n"
    '{{"name": <tool-name-1>, "arguments": <args-json-object-1>}}\n...\n</tool_calls>'
)


def _describe_minimax1(tools: list[dict]) -> str:
    return _MINIMAX1_PROMPT.format(tool_text="".join(dump(unwrap(tool)) + "\n" for tool in tools))


def _format_minimax1(calls: list[FunctionCall]) -> str:
    lines = [dump({"name": call.name, "arguments": json.loads(call.arguments)}) for call in calls]
    return "<tool_calls>\n" + "\n".join(lines) + "\n</tool_calls>"


_MINIMAX1_CALLS = re.compile(r"<tool_calls>\s*(.+?)\s*</tool_calls>", re.DOTALL)


def _extract_minimax1(text: str):
    block = _MINIMAX1_CALLS.search(text)
    if block is None:
        return text
    calls = []
    for line in filter(None, (line.strip() for line in block.group(1).split("\n"))):
        try:
            call = json.loads(line)
            calls.append(FunctionCall(call["name"], dump(call["arguments"])))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # LLaMA-Factory skips lines that are not JSON calls, too
    return calls or text


FORMATS = [
    ToolFormat("default", _describe_default, _format_default, _extract_default),
    ToolFormat("qwen", _describe_qwen, _format_qwen, _extract_qwen),
    ToolFormat("ling", _describe_ling, _format_qwen, _extract_qwen),
    ToolFormat("llama3", _describe_llama3, _format_llama3, lambda text: _extract_json_calls(text, "parameters")),
    ToolFormat("mistral", _describe_mistral, _format_mistral, lambda text: _extract_json_calls(text, "arguments")),
    ToolFormat("glm4", _describe_glm4, _format_glm4, _extract_glm4),
    ToolFormat("minimax1", _describe_minimax1, _format_minimax1, _extract_minimax1),
]
