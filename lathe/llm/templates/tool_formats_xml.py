"""Tool formats that write each argument in its own tag (qwen3_5, glm4_moe, minimax2, seed_oss), as Gemma 4's
declarations (gemma4) or as Python calls (lfm2). The text each writes is byte for byte what LLaMA-Factory
0.9.5 writes for the same name, including where that is not what the model's own chat_template writes
(glm4_moe leaves </tool_call> out, minimax2 leaves out the <minimax:tool_call> wrapper). Reading calls back
accepts what the same format writes."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from lathe.llm.templates.tool_calls import FunctionCall, ToolFormat, dump, parse_value, value_text, wrap


def _arguments(call: FunctionCall) -> dict:
    return json.loads(call.arguments)


def _unwrap_keeping(tool: dict) -> dict:
    """qwen3_5 / lfm2 / gemma4 unwrap OpenAI style entries but keep the entry when it has no "function"."""
    return tool.get("function", tool) if tool.get("type") == "function" else tool


# ---- qwen3_5 (Qwen3.5 / 3.6): <function=name> with one <parameter=key> block per argument.
_QWEN35_PROMPT = (
    "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>{tool_text}"
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: "
    "an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language "
    "BEFORE the function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)


def _describe_qwen35(tools: list[dict]) -> str:
    return _QWEN35_PROMPT.format(tool_text="".join("\n" + dump(_unwrap_keeping(tool)) for tool in tools))


def _format_qwen35(calls: list[FunctionCall]) -> str:
    texts = []
    for call in calls:
        parameters = "".join(
            f"\n<parameter={key}>\n{value_text(value)}\n</parameter>" for key, value in _arguments(call).items()
        )
        texts.append(f"<tool_call>\n<function={call.name}>{parameters}\n</function>\n</tool_call>")
    return "\n".join(texts)


def _tagged_calls(text: str, call_pattern: str, parameter_pattern: str, raw_strip: bool):
    calls = []
    for name, block in re.findall(call_pattern, text, re.DOTALL):
        arguments = {}
        for key, raw in re.findall(parameter_pattern, block.strip(), re.DOTALL):
            arguments[key] = parse_value(raw.strip(), raw.strip() if raw_strip else raw)
        calls.append(FunctionCall(name.strip(), dump(arguments)))
    return calls or text


def _extract_qwen35(text: str):
    return _tagged_calls(
        text,
        r"<tool_call>\s*<function=\s*([^\s<>]+)\s*(.*?)\s*</function>\s*</tool_call>",
        r"<parameter=(.*?)>(.*?)</parameter>",
        raw_strip=True,
    )


# ---- glm4_moe (GLM-4.5 / 4.6 / 4.7): <tool_call>name, then <arg_key>/<arg_value> pairs.
_GLM4_MOE_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}"
    "\n</tools>\n\nFor each function call, output the function name and arguments within the following XML format:"
    "\n<tool_call>{{function-name}}"
    "\n<arg_key>{{arg-key-1}}</arg_key>"
    "\n<arg_value>{{arg-value-1}}</arg_value>"
    "\n<arg_key>{{arg-key-2}}</arg_key>"
    "\n<arg_value>{{arg-value-2}}</arg_value>"
    "\n...\n</tool_call>\n"
)


def _describe_glm4_moe(tools: list[dict]) -> str:
    return _GLM4_MOE_PROMPT.format(tool_text="".join("\n" + dump(wrap(tool)) for tool in tools))


def _format_glm4_moe(calls: list[FunctionCall]) -> str:
    texts = []
    for call in calls:
        pairs = "".join(
            f"\n<arg_key>{key}</arg_key>\n<arg_value>{value_text(value)}</arg_value>"
            for key, value in _arguments(call).items()
        )
        texts.append(f"\n<tool_call>{call.name}{pairs}")
    return "\n".join(texts)


def _extract_glm4_moe(text: str):
    calls = []
    for chunk in text.split("<tool_call>")[1:]:
        name = re.split(r"[\n<]", chunk, maxsplit=1)[0].strip()
        pairs = re.findall(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", chunk, re.DOTALL)
        if not name:
            return text
        calls.append(FunctionCall(name, dump({key: parse_value(value.strip(), value) for key, value in pairs})))
    return calls or text


# ---- minimax2 (MiniMax-M2): <invoke name="..."> with <parameter name="..."> per argument.
_MINIMAX2_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more tools to assist with the user query.\n"
    "Here are the tools available in JSONSchema format:\n\n<tools>\n{tool_text}</tools>\n\n"
    "When making tool calls, use XML format to invoke tools and pass parameters:\n"
    '\n<minimax:tool_call>\n<invoke name="tool-name-1">\n<parameter name="param-key-1">param-value-1</parameter>\n'
    '<parameter name="param-key-2">param-value-2</parameter>\n...\n</invoke>\n</minimax:tool_call>'
)


def _describe_minimax2(tools: list[dict]) -> str:
    tool_text = "".join(
        "<tool>" + dump(tool.get("function", "") if tool.get("type") == "function" else tool) + "</tool>\n"
        for tool in tools
    )
    return _MINIMAX2_PROMPT.format(tool_text=tool_text)


def _format_minimax2(calls: list[FunctionCall]) -> str:
    texts = []
    for call in calls:
        parameters = "".join(
            f'\n<parameter name="{key}">{value_text(value)}</parameter>' for key, value in _arguments(call).items()
        )
        texts.append(f'<invoke name="{call.name}">{parameters}\n</invoke>')
    return "\n".join(texts)


def _extract_minimax2(text: str):
    return _tagged_calls(
        text, r"<invoke name=\"(.*?)\">(.*?)</invoke>", r"<parameter name=\"(.*?)\">(.*?)</parameter>", raw_strip=False
    )


# ---- seed_oss (Seed-OSS): <seed:tool_call><function=name> with <parameter=key> per argument.
_SEED_PROMPT = (
    "system\nYou are Doubao, a helpful AI assistant. You may call one or more functions to assist with the user query."
    "Tool List:\nYou are authorized to use the following tools (described in JSON Schema format). Before performing "
    "any task, you must decide how to call them based on the descriptions and parameters of these tools.{tool_text}\n"
    "工具调用请遵循如下格式:\n<seed:tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>value_1"
    "</parameter>\n<parameter=example_parameter_2>This is the value for the second parameter\nthat can span\nmultiple "
    "lines</parameter>\n</function>\n</seed:tool_call>\n"
)


def _describe_seed(tools: list[dict]) -> str:
    return _SEED_PROMPT.format(tool_text="\n" + dump(tools))


def _format_seed(calls: list[FunctionCall]) -> str:
    texts = []
    for call in calls:
        parameters = "".join(
            f"\n<parameter={key}>{value_text(value)}</parameter>" for key, value in _arguments(call).items()
        )
        texts.append(f"\n<seed:tool_call>\n<function={call.name}{parameters}\n</function>\n</seed:tool_call>")
    return "\n".join(texts)


def _extract_seed(text: str):
    return _tagged_calls(
        text,
        r"<seed:tool_call>\s*<function=\s*([^\s<]+)\s*(.*?)\s*</function>\s*</seed:tool_call>",
        r"<parameter=(.*?)>(.*?)</parameter>",
        raw_strip=False,
    )


# ---- gemma4 (Gemma 4): declarations and calls in Gemma's own notation, strings quoted with <|"|>.
_QUOTE = '<|"|>'


def _quoted(text: Any) -> str:
    return f"{_QUOTE}{text}{_QUOTE}"


def _schema_parts(schema: dict) -> list[str]:
    parts = [f"description:{_quoted(schema['description'])}"] if schema.get("description") else []
    return parts + ([f"type:{_quoted(str(schema['type']).upper())}"] if schema.get("type") else [])


def _describe_gemma4(tools: list[dict]) -> str:
    declarations = []
    for tool in tools:
        function = _unwrap_keeping(tool)
        text = f"declaration:{function['name']}{{description:{_quoted(function.get('description', ''))}"
        parameters = function.get("parameters")
        if parameters:
            parts = []
            if parameters.get("properties"):
                properties = ",".join(
                    f"{name}:{{{','.join(_schema_parts(schema))}}}" for name, schema in parameters["properties"].items()
                )
                parts.append(f"properties:{{{properties}}}")
            if parameters.get("required"):
                parts.append("required:[" + ",".join(_quoted(item) for item in parameters["required"]) + "]")
            if parameters.get("type"):
                parts.append(f"type:{_quoted(str(parameters['type']).upper())}")
            text += f",parameters:{{{','.join(parts)}}}"
        response = function.get("response")
        if response:
            parts = [f"description:{_quoted(response['description'])}"] if response.get("description") else []
            if str(response.get("type", "")).upper() == "OBJECT":
                parts.append(f"type:{_quoted('OBJECT')}")
            text += f",response:{{{','.join(parts)}}}"
        declarations.append(text + "}")
    return "\n".join(declarations)


def _gemma4_value(value: Any, quote_keys: bool = True) -> str:
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        items = [
            f"{_quoted(key) if quote_keys else key}:{_gemma4_value(value[key], quote_keys)}" for key in sorted(value)
        ]
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_gemma4_value(item, quote_keys) for item in value) + "]"
    return "null" if value is None else str(value)


def _format_gemma4(calls: list[FunctionCall]) -> str:
    texts = []
    for call in calls:
        try:
            arguments = json.loads(call.arguments)
        except (TypeError, json.JSONDecodeError):
            arguments = call.arguments
        if isinstance(arguments, dict):
            body = ",".join(f"{key}:{_gemma4_value(arguments[key], quote_keys=False)}" for key in sorted(arguments))
        elif isinstance(arguments, str):
            body = arguments
        else:
            body = _gemma4_value(arguments, quote_keys=False)
        texts.append(f"<|tool_call>call:{call.name}{{{body}}}<tool_call|>")
    return "".join(texts)


def _gemma4_arguments(text: str) -> Any:
    text = text.strip()
    if not text:
        return {}
    normalized = re.sub(r"<\|\"\|>(.*?)<\|\"\|>", lambda match: dump(match.group(1)), "{" + text + "}", flags=re.DOTALL)
    normalized = re.sub(r"(^|[{\s,])([A-Za-z_][A-Za-z0-9_]*)(\s*:)", r'\1"\2"\3', normalized)
    for candidate in (normalized, text):
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return text


def _extract_gemma4(text: str):
    matches = re.findall(r"<\|tool_call>call:([^{\s]+)\{(.*?)\}<tool_call\|>", text, re.DOTALL)
    calls = []
    for name, block in matches:
        arguments = _gemma4_arguments(block)
        calls.append(FunctionCall(name.strip(), arguments if isinstance(arguments, str) else dump(arguments)))
    return calls or text


# ---- lfm2 (LFM2.5): calls written as a Python list of keyword calls between <|tool_call_start|> markers.
def _describe_lfm2(tools: list[dict]) -> str:
    return f"List of tools: <|tool_list_start|>{dump([_unwrap_keeping(tool) for tool in tools])}<|tool_list_end|>"


def _format_lfm2(calls: list[FunctionCall]) -> str:
    texts = []
    for call in calls:
        keywords = [
            f'{key}="{value}"' if isinstance(value, str) else f"{key}={dump(value)}"
            for key, value in _arguments(call).items()
        ]
        texts.append(f"{call.name}({', '.join(keywords)})")
    return f"<|tool_call_start|>[{', '.join(texts)}]<|tool_call_end|>"


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Name):
        if node.id not in _JSON_NAMES:
            raise ValueError(node.id)
        return _JSON_NAMES[node.id]
    return ast.literal_eval(node)


def _extract_lfm2(text: str):
    start = text.find("<|tool_call_start|>")
    end = text.find("<|tool_call_end|>", start) if start != -1 else -1
    if end == -1:
        return text
    try:
        tree = ast.parse(text[start + len("<|tool_call_start|>") : end].strip(), mode="eval").body
        nodes = tree.elts if isinstance(tree, ast.List) else [tree]
        calls = []
        for node in nodes:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                return text
            arguments = {keyword.arg: _literal(keyword.value) for keyword in node.keywords}
            calls.append(FunctionCall(node.func.id, dump(arguments)))
    except (SyntaxError, ValueError):
        return text
    return calls or text


FORMATS = [
    ToolFormat("qwen3_5", _describe_qwen35, _format_qwen35, _extract_qwen35),
    ToolFormat("glm4_moe", _describe_glm4_moe, _format_glm4_moe, _extract_glm4_moe),
    ToolFormat("minimax2", _describe_minimax2, _format_minimax2, _extract_minimax2),
    ToolFormat("seed_oss", _describe_seed, _format_seed, _extract_seed),
    ToolFormat("gemma4", _describe_gemma4, _format_gemma4, _extract_gemma4),
    ToolFormat("lfm2", _describe_lfm2, _format_lfm2, _extract_lfm2),
]
