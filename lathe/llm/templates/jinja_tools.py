"""Tools in the Jinja chat_template lathe writes at export, for the tool formats written as Jinja (default,
qwen, ling): the tools' description appended to the system message and an assistant's `tool_calls` written
as the model was trained to write them, the same text as tool_formats_json (checked token for token in
tests/llm/test_first_day.py). Other formats are not written: their chat_template raises when given tools,
and export says so."""

from __future__ import annotations

from lathe.llm.templates.tool_formats_json import DEFAULT_PROMPT, TOOLS_BLOCK

__all__ = ["JINJA_TOOL_FORMATS", "renders_tools", "tools_statement", "tool_calls_statement"]

JINJA_TOOL_FORMATS = ("default", "qwen", "ling")


def _unbrace(text: str) -> str:
    return text.replace("{{", "{").replace("}}", "}")


def renders_tools(template) -> bool:
    """Whether the exported chat_template of `template` renders tools (else it raises when given some)."""
    return template.tool_format in JINJA_TOOL_FORMATS and template.raw_tools_slot is None


def tools_statement(template) -> str:
    """Jinja that appends the tools' description to `system_message` (as Template._tools_text does)."""
    body = _describe_default() if template.tool_format == "default" else _describe_qwen(template.tool_format)
    return "{% if tools is defined and tools %}" + body + "{% endif %}"


def _describe_qwen(name: str) -> str:
    """ "\\n" + tojson(the tool as {"type": "function", "function": ...}) per tool, inside Qwen's <tools> block."""
    head, _, tail = TOOLS_BLOCK.partition("{tool_text}")
    before, after = ("\n\n", "") if name == "qwen" else ("", "\ndetailed thinking off")
    return (
        "{% set ns = namespace(text='') %}{% for tool in tools %}"
        "{% if tool.get('type') == 'function' %}{% set wrapped = tool %}"
        "{% else %}{% set wrapped = {'type': 'function', 'function': tool} %}{% endif %}"
        "{% set ns.text = ns.text + '\\n' + (wrapped | tojson) %}{% endfor %}"
        "{% set system_message = system_message + "
        + jinja_literal(before + _unbrace(head))
        + " + ns.text + "
        + jinja_literal(_unbrace(tail) + after)
        + " %}"
    )


def _describe_default() -> str:
    """The ReAct-like listing: "> Tool Name: ..." per tool, one "  - name (type, required): ..." per argument."""
    head, _, rest = DEFAULT_PROMPT.partition("{tool_text}")
    middle, _, tail = rest.partition("{tool_names}")
    return (
        "{% set ns = namespace(text='', names=[]) %}{% for tool in tools %}"
        "{% set function = tool['function'] if tool.get('type') == 'function' else tool %}"
        "{% set parameters = function['parameters'] %}{% set lines = namespace(text='') %}"
        "{% for name, param in parameters['properties'].items() %}"
        "{% set required = ', required' if name in parameters.get('required', []) else '' %}"
        "{% set enum = ', should be one of [' + (param['enum'] | join(', ')) + ']' if param.get('enum') else '' %}"
        "{% set items = ', where each item should be ' + param['items'].get('type', '') "
        "if param.get('items') else '' %}"
        "{% set lines.text = lines.text + '  - ' + name + ' (' + param.get('type', '') + required + '): ' "
        "+ param.get('description', '') + enum + items + '\\n' %}{% endfor %}"
        "{% set ns.text = ns.text + '> Tool Name: ' + function['name'] + '\\nTool Description: ' "
        "+ function.get('description', '') + '\\nTool Args:\\n' + lines.text + '\\n' %}"
        "{% set ns.names = ns.names + [function['name']] %}{% endfor %}"
        "{% set system_message = system_message + "
        + jinja_literal(_unbrace(head))
        + " + ns.text + "
        + jinja_literal(_unbrace(middle))
        + " + (ns.names | join(', ')) + "
        + jinja_literal(_unbrace(tail))
        + " %}"
    )


def tool_calls_statement(template) -> str:
    """Jinja that sets `content` to an assistant message's tool_calls as the format writes them, one call a
    line: qwen / ling "<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>", default "Action: name\\n
    Action Input: arguments". Arguments given as a JSON string (OpenAI's form) are written as they are."""
    if template.tool_format == "default":
        call = "'Action: ' + function['name'] + '\\nAction Input: ' + arguments"
    else:
        call = "'<tool_call>\\n{\"name\": ' + (function['name'] | tojson) + ', \"arguments\": ' + arguments + '}\\n</tool_call>'"
    return (
        "{% set ns = namespace(calls=[]) %}{% for call in message['tool_calls'] %}"
        "{% set function = call['function'] if call.get('function') is mapping else call %}"
        "{% set arguments = function['arguments'] if function['arguments'] is string "
        "else (function['arguments'] | tojson) %}"
        "{% set ns.calls = ns.calls + [" + call + "] %}{% endfor %}"
        "{% set content = ns.calls | join('\\n') %}"
    )


def jinja_literal(text: str) -> str:
    """A Jinja string literal for `text`. Jinja decodes backslash escapes in literals and normalises
    raw CR/LF, so backslash, quote and control characters are escaped."""
    escaped = []
    for char in text:
        if char in "\\'":
            escaped.append("\\" + char)
        elif char == "\n":
            escaped.append("\\n")
        elif char == "\r":
            escaped.append("\\r")
        elif char == "\t":
            escaped.append("\\t")
        elif ord(char) < 0x20:
            escaped.append(f"\\x{ord(char):02x}")
        else:
            escaped.append(char)
    return "'" + "".join(escaped) + "'"
