"""The template registry: every named template (one module per family registers its own), looked up by the
name in the config. Fitting the tokenizer to the template is resolve.py's get_template_and_fix_tokenizer."""

from __future__ import annotations

from lathe.llm.strict_files import did_you_mean
from lathe.llm.templates import (
    chatml,
    deepseek,
    gemma,
    generic,
    glm,
    granite,
    llama,
    mistral,
    phi,
    qwen,
    tencent,
    vendors,
)
from lathe.llm.templates.template import Template

TEMPLATES: dict[str, Template] = {}


def register_template(template: Template) -> None:
    if template.name in TEMPLATES:
        raise ValueError(f"Template {template.name!r} is already registered.")
    TEMPLATES[template.name] = template


# Every text template of LLaMA-Factory 0.9.5, and the text use of those it pairs with a multimodal plugin.
for _family in (generic, chatml, qwen, llama, mistral, gemma, glm, deepseek, phi, granite, tencent, vendors):
    for _template in _family.TEMPLATES:
        register_template(_template)


def template_names() -> list[str]:
    return sorted(TEMPLATES)


def unknown_template_message(name: str) -> str:
    """The closest names when some are close, else the first few: all 121 drown the line."""
    hint = did_you_mean(name, template_names(), n=3).removeprefix("; ")
    if not hint:
        hint = f"known ones include {', '.join(template_names()[:12])}, ..."
    return f"Unknown template {name!r}: {hint} ({len(TEMPLATES)} in all; `python -m lathe.llm.templates` lists them)"


def get_template(name: str) -> Template:
    """A fresh copy of a registered template (callers may change it without touching the registry)."""
    if name not in TEMPLATES:
        raise ValueError(unknown_template_message(name))
    return TEMPLATES[name].copy()
