"""An Ollama `Modelfile` beside a GGUF file: `FROM`, a `TEMPLATE` in Ollama's Go-template syntax that renders
what lathe's template renders for system / user / assistant / tool turns, `PARAMETER stop` for each stop
string and `SYSTEM` with the template's default system prompt.

The TEMPLATE uses a small subset of Go's text/template (range over .Messages, if / else if on .Role,
.Content, one variable for Llama-2-style templates that put the system text inside the first user turn),
with no whitespace-trimming markers, so every character of the template's slots is literal text. BOS is
left to llama.cpp when the GGUF adds it (add_bos_token) and the template puts it in its prefix, as Ollama's
own templates do. Not rendered: tool
calls of assistant messages (.ToolCalls) and the tool descriptions of the system turn; a reasoning
template's earlier thoughts are not removed from the history (lathe removes them).
"""

from __future__ import annotations

import json

from lathe.llm.templates.slots import CONTENT, SpecialToken

ROLES = (("user", "user"), ("assistant", "assistant"), ("tool", "observation"))


def go_template(template, tokenizer, adds_bos: bool) -> str:
    """Ollama's TEMPLATE for a lathe template."""

    def text(slots, value: str, first: bool = False) -> str:
        parts = []
        for slot in slots:
            if isinstance(slot, SpecialToken):
                parts.append(_literal(_special(slot, tokenizer, adds_bos and first)))
            else:
                before, found, after = slot.partition(CONTENT)
                parts.append(_literal(before) + (value if found else "") + _literal(after))
        return "".join(parts)

    prefix = text(template.prefix, "", first=True)
    turns = []
    if template.system_in_first_user:
        first = template.system[0] if template.system and isinstance(template.system[0], str) else CONTENT
        before, _, after = first.partition(CONTENT)
        system_branch = '{{ if eq .Role "system" }}{{ $system = .Content }}'
        user = text(template.user, _SYSTEM_IN_USER.format(before=_literal(before), after=_literal(after)))
        turns.append(system_branch + '{{ else if eq .Role "user" }}' + user)
    else:
        system = text(template.system, "{{ .Content }}")
        turns.append('{{ if eq .Role "system" }}{{ if .Content }}' + system + "{{ end }}")
        turns.append('{{ else if eq .Role "user" }}' + text(template.user, "{{ .Content }}"))
    for role, slots in ROLES[1:]:
        turns.append(f'{{{{ else if eq .Role "{role}" }}}}' + text(getattr(template, slots), "{{ .Content }}"))
    start = '{{ $system := "" }}' if template.system_in_first_user else ""
    return start + prefix + "{{ range .Messages }}" + "".join(turns) + "{{ end }}{{ end }}"


_SYSTEM_IN_USER = (
    '{{{{ if $system }}}}{before}{{{{ $system }}}}{after}{{{{ $system = "" }}}}{{{{ end }}}}{{{{ .Content }}}}'
)


def _literal(value: str) -> str:
    """Text as Go template literal text ("{{" printed by an action)."""
    return '{{ "{{" }}'.join(value.split("{{"))


def _special(token: SpecialToken, tokenizer, adds_bos: bool) -> str:
    if token.kind == "token":
        return token.text
    if token.kind == "bos":
        return "" if adds_bos or tokenizer.bos_token_id is None else tokenizer.bos_token
    return "" if tokenizer.eos_token_id is None else tokenizer.eos_token


def stop_strings(template, tokenizer) -> list[str]:
    """The template's stop tokens as text (EOS first, then each stop word)."""
    words = [tokenizer.convert_ids_to_tokens(token_id) for token_id in template.get_stop_token_ids(tokenizer)]
    return list(dict.fromkeys(word for word in words if word))


def modelfile(gguf_name: str, template, tokenizer, adds_bos: bool) -> str:
    body = go_template(template, tokenizer, adds_bos)
    if '"""' in body or '"""' in template.default_system:
        raise ValueError('export_gguf: the template holds """, which an Ollama Modelfile cannot quote.')
    lines = [f"FROM ./{gguf_name}", f'TEMPLATE """{body}"""']
    lines += [f"PARAMETER stop {json.dumps(word, ensure_ascii=False)}" for word in stop_strings(template, tokenizer)]
    if template.default_system:
        lines.append(f'SYSTEM """{template.default_system}"""')
    return "\n".join(lines) + "\n"
