"""A Template as a Jinja chat_template, so that `tokenizer.apply_chat_template` (and any server that
reads the saved tokenizer) renders the same text, hence the same ids, the model was trained on.

Roles: system (first message; empty content means the template's default system), user, assistant,
and tool/observation (tool results); reasoning templates add the empty thought where training does
(LLaMA-Factory's export does not). Tool descriptions and tool-call messages are not rendered: the
template raises instead of silently producing a prompt the model never saw. Special tokens are written
as their text (not `eos_token`), because the EOS variable may be replaced by a server.
"""
from __future__ import annotations

from lathe.llm.templates.template import CONTENT, Template


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
    default_system = jinja_literal(template.default_system)
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
        if not template.enable_thinking:  # the empty thought was trained as prompt: the prompt ends with it
            generation_part = "{% if add_generation_prompt %}{{ " + _empty_thought(template) + " }}{% endif %}"
    return (
        "{% if tools is defined and tools %}"
        "{{ raise_exception('This chat template (lathe template " + template.name + ") does not render tools.') }}"
        "{% endif %}"
        "{% set system_message = " + default_system + " %}"
        "{% if messages and messages[0]['role'] == 'system' %}"
        "{% set loop_messages = messages[1:] %}"
        "{% if messages[0]['content'] %}{% set system_message = messages[0]['content'] %}{% endif %}"
        "{% else %}{% set loop_messages = messages %}{% endif %}"
        "{{ " + expression(template.prefix) + " }}"
        "{% for message in loop_messages %}"
        "{% set content = message['content'] %}"
        "{% if loop.first and system_message %}" + system_part + "{% endif %}"
        "{% if message['role'] == 'user' %}{{ " + expression(template.user) + " }}"
        "{% elif message['role'] == 'assistant' %}" + assistant_part +
        "{% elif message['role'] in ['tool', 'observation'] %}{{ " + expression(template.observation) + " }}"
        "{% else %}{{ raise_exception('Unsupported role: ' + message['role']) }}"
        "{% endif %}"
        "{% endfor %}" + generation_part
    )


def _empty_thought(template: Template) -> str:
    return jinja_literal(template.thought_words[0] + template.thought_words[1])


def _thought_handling(template: Template) -> str:
    """Reasoning templates: answers are trained with an empty thought where they have none, and with
    thinking disabled their own thoughts are removed first (the text after the closing thought word)."""
    start, end = (jinja_literal(word.strip()) for word in template.thought_words)
    handling = ""
    if template.enable_thinking is False:
        handling += ("{% if " + end + " in content %}{% set content = content.split(" + jinja_literal(
            template.thought_words[1]) + ")[-1].lstrip('\\n') %}{% endif %}")
    return handling + ("{% if " + start + " not in content and " + end + " not in content %}"
                       "{% set content = " + _empty_thought(template) + " + content %}{% endif %}")
