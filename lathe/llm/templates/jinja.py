"""A Template as a Jinja chat_template, so that `tokenizer.apply_chat_template` (and any server that
reads the saved tokenizer) renders the ids lathe's own chat engine and LLaMA-Factory's generate from.

What it renders is `encode_oneturn` of the conversation: every message in the template's slots, and with
`add_generation_prompt` the prompt for the next answer. Roles: system (first message; empty content means
the template's default system), user, assistant, and tool/observation (tool results). Reasoning templates
render history answers as LLaMA-Factory's inference does: their thoughts removed (kept with
preserve_thinking) and no empty thought added; the last answer, when the conversation ends with one, gets
the empty thought if it has none (what training writes), and with thinking disabled the generation prompt
ends with the empty thought. An `enable_thinking` render argument overrides the template's setting, as
with Qwen's own templates. Tool descriptions and assistant `tool_calls` are rendered for the tool formats
jinja_tools.py writes (default, qwen, ling); with any other the template raises when given tools instead of silently
producing a prompt the model never saw. Special tokens are written as their text (not
`eos_token`), because the EOS variable may be replaced by a server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lathe.llm.templates.jinja_tools import jinja_literal, renders_tools, tool_calls_statement, tools_statement
from lathe.llm.templates.slots import CONTENT

if TYPE_CHECKING:  # annotations only: template.py calls this module
    from lathe.llm.templates.template import Template


def special_token_text(element, tokenizer) -> str:
    if element.kind == "token":
        return element.text
    token = tokenizer.bos_token if element.kind == "bos" else tokenizer.eos_token
    token_id = tokenizer.bos_token_id if element.kind == "bos" else tokenizer.eos_token_id
    return token if token_id is not None else ""


def slots_expression(slots, tokenizer, variable: str = "content") -> str:
    """Slots -> a Jinja expression concatenating literals and `variable` (first {{content}} of each
    string, like the encoder); "''" for no slots."""
    parts = []
    for element in slots:
        if isinstance(element, str):
            before, found, after = element.partition(CONTENT)
            parts += [jinja_literal(before)] if before else []
            parts += [variable] if found else []
            parts += [jinja_literal(after)] if after else []
        else:
            text = special_token_text(element, tokenizer)
            parts += [jinja_literal(text)] if text else []
    return " + ".join(parts) or "''"


def build_jinja_chat_template(template: Template, tokenizer) -> str:
    expression = lambda slots, variable="content": slots_expression(slots, tokenizer, variable)  # noqa: E731
    if template.system_in_first_user:
        # only the first system slot, glued to the first message's content (as the encoder does)
        first_system = expression(template.system[:1], "system_message")
        system_part = "{% set content = " + first_system + " + content %}"
    else:
        system_part = "{{ " + expression(template.system, "system_message") + " }}"
    assistant_part = "{{ " + expression(template.assistant) + " }}"
    generation_part = ""
    if template.reasoning:
        assistant_part = _thought_handling(template) + assistant_part
        generation_part = (
            "{% if add_generation_prompt and not thinking %}{{ "
            + jinja_literal(template.empty_thought_text())
            + " }}{% endif %}"
        )

    tools_part, tools_setup, calls_part = _tool_parts(template, expression)
    return (
        tools_part
        + _thinking_switch(template)
        + "{% set system_message = "
        + jinja_literal(template.default_system)
        + " %}"
        "{% if messages and messages[0]['role'] == 'system' %}"
        "{% set loop_messages = messages[1:] %}"
        "{% if messages[0]['content'] %}{% set system_message = messages[0]['content'] %}{% endif %}"
        "{% else %}{% set loop_messages = messages %}{% endif %}"
        + tools_setup
        + "{{ "
        + expression(template.prefix)
        + " }}"
        "{% for message in loop_messages %}"
        "{% set content = message['content'] %}"
        "{% if loop.first and system_message %}" + system_part + "{% endif %}"
        "{% if message['role'] == 'user' %}{{ " + expression(template.user) + " }}" + calls_part + ""
        "{% elif message['role'] == 'assistant' %}"
        + assistant_part
        + "{% elif message['role'] in ['tool', 'observation'] %}{{ "
        + expression(template.observation)
        + " }}"
        "{% else %}{{ raise_exception('Unsupported role: ' + message['role']) }}"
        "{% endif %}"
        "{% endfor %}" + generation_part
    )


def _tool_parts(template: Template, expression) -> tuple[str, str, str]:
    """What the template writes for tools: a guard before everything, the tools block after the system
    message, and the assistant's tool calls; a tool format jinja_tools cannot write raises when given tools."""
    if not renders_tools(template):
        guard = (
            "{% if tools is defined and tools %}{{ raise_exception('This chat template (lathe template "
            + template.name
            + ") does not render tools.') }}{% endif %}"
        )
        return guard, "", ""
    calls = (
        "{% elif message['role'] == 'assistant' and message.get('tool_calls') %}"
        + tool_calls_statement(template)
        + "{{ "
        + expression(template.function)
        + " }}"
    )
    return "", tools_statement(template), calls


def _thinking_switch(template: Template) -> str:
    if not template.reasoning:
        return ""
    default = "false" if template.enable_thinking is False else "true"
    return (
        "{% if enable_thinking is defined and enable_thinking is not none %}{% set thinking = enable_thinking %}"
        "{% else %}{% set thinking = " + default + " %}{% endif %}"
    )


def _thought_handling(template: Template) -> str:
    """encode_oneturn's thoughts: history answers lose theirs (unless preserve_thinking), and with thinking
    disabled the last answer too; the last answer without a thought gets the empty one (trained as the
    answer's start when thinking, as the prompt's end when not: the same text either way)."""
    start, end = template.thought_words
    remove = (
        "{% set content = (content.split("
        + jinja_literal(start)
        + ")[0] + content.split("
        + jinja_literal(end)
        + ")[-1]).lstrip('\\n') if "
        + jinja_literal(end)
        + " in content and "
        + jinja_literal(start)
        + " in content else content %}"
    )
    is_last = "loop.last"
    history = "not " + is_last if not template.preserve_thinking else "false"
    has_thought = jinja_literal(start.strip()) + " in content or " + jinja_literal(end.strip()) + " in content"
    return (
        "{% if " + history + " or (" + is_last + " and not thinking) %}" + remove + "{% endif %}"
        "{% if " + is_last + " and not (" + has_thought + ") %}"
        "{% set content = " + jinja_literal(template.empty_thought_text()) + " + content %}{% endif %}"
    )
