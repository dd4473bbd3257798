"""Tools in the Jinja chat_template lathe writes at export, for the tool formats written as Jinja: the
tools' description appended to the system message and an assistant's `tool_calls` written as the model was
trained to write them, the same text as tool_formats_json (checked token for token in the tests). Other
formats are not written: their chat_template raises when given tools, and export says so."""

from __future__ import annotations

from lathe.llm.templates.jinja import jinja_literal
from lathe.llm.templates.tool_formats_json import TOOLS_BLOCK

__all__ = ["JINJA_TOOL_FORMATS", "renders_tools", "tools_statement", "tool_calls_statement"]

# name -> (text before the tools' lines, text after them) around "\n" + tojson(wrapped tool) per tool.
JINJA_TOOL_FORMATS: dict[str, tuple[str, str]] = {}


def _split_block(before: str, after: str) -> tuple[str, str]:
    head, _, tail = TOOLS_BLOCK.partition("{tool_text}")
    return before + head.replace("{{", "{").replace("}}", "}"), tail.replace("{{", "{").replace("}}", "}") + after


JINJA_TOOL_FORMATS["qwen"] = _split_block("\n\n", "")
JINJA_TOOL_FORMATS["ling"] = _split_block("", "\ndetailed thinking off")


def renders_tools(template) -> bool:
    """Whether the exported chat_template of `template` renders tools (else it raises when given some)."""
    return template.tool_format in JINJA_TOOL_FORMATS and template.raw_tools_slot is None


def tools_statement(template) -> str:
    """Jinja that appends the tools' description to `system_message` (as Template._tools_text does)."""
    before, after = JINJA_TOOL_FORMATS[template.tool_format]
    return (
        "{% if tools is defined and tools %}{% set ns = namespace(text='') %}{% for tool in tools %}"
        "{% if tool.get('type') == 'function' %}{% set wrapped = tool %}"
        "{% else %}{% set wrapped = {'type': 'function', 'function': tool} %}{% endif %}"
        "{% set ns.text = ns.text + '\\n' + (wrapped | tojson) %}{% endfor %}"
        "{% set system_message = system_message + "
        + jinja_literal(before)
        + " + ns.text + "
        + jinja_literal(after)
        + " %}{% endif %}"
    )


def tool_calls_statement() -> str:
    """Jinja that sets `content` to an assistant message's tool_calls as the qwen / ling formats write them:
    "<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>", one a line. Arguments given as a JSON
    string (OpenAI's form) are written as they are."""
    return (
        "{% set ns = namespace(calls=[]) %}{% for call in message['tool_calls'] %}"
        "{% set function = call['function'] if call.get('function') is mapping else call %}"
        "{% set arguments = function['arguments'] if function['arguments'] is string "
        "else (function['arguments'] | tojson) %}"
        "{% set ns.calls = ns.calls + ['<tool_call>\\n{\"name\": ' + (function['name'] | tojson) + ', \"arguments\": '"
        " + arguments + '}\\n</tool_call>'] %}{% endfor %}"
        "{% set content = ns.calls | join('\\n') %}"
    )
