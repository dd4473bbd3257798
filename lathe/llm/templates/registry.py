"""The template registry and `get_template_and_fix_tokenizer`: the name in the config -> a Template,
with the tokenizer made to agree with it (EOS, PAD, stop words, chat_template)."""

from __future__ import annotations

import logging

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
from lathe.llm.templates.template import EOS, Template
from lathe.llm.templates.tools import get_tool_format

logger = logging.getLogger("lathe.llm.templates")

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


def get_template_and_fix_tokenizer(tokenizer, data_args) -> Template:
    """`data_args.template` (None: parse the tokenizer's own chat_template, or `empty` when it has none)
    -> a Template; data_args' tool_format / default_system / enable_thinking / preserve_thinking are
    applied to it, and the tokenizer gets the template's EOS, PAD, stop words and chat_template."""
    name = getattr(data_args, "template", None)
    if name is not None:
        template = get_template(name)
    elif isinstance(getattr(tokenizer, "chat_template", None), str):
        from lathe.llm.templates.parsing import template_from_chat_template

        logger.warning("`template` was not given: using the tokenizer's own chat_template.")
        template = template_from_chat_template(tokenizer)
    else:
        logger.warning("`template` was not given and the tokenizer has no chat_template: using `empty`.")
        template = get_template("empty")

    if getattr(data_args, "train_on_prompt", False) and template.efficient_eos:
        raise ValueError(f"Template {template.name!r} (efficient_eos) does not support `train_on_prompt`.")

    tool_format = getattr(data_args, "tool_format", None)
    if tool_format is not None:
        get_tool_format(tool_format)  # unknown names fail here, not at the first tool call
        # As LLaMA-Factory: an explicit tool_format also resets the tool-call slots to content + EOS.
        function = ("{{content}}",) if template.efficient_eos else ("{{content}}", EOS)
        template = template.copy(tool_format=tool_format, function=function, raw_tools_slot=None)
    default_system = getattr(data_args, "default_system", None)
    if default_system is not None:
        template = template.copy(default_system=default_system)
    if template.reasoning:
        logger.warning("A reasoning template: use its `_nothink` variant if the model does not reason.")
        template = template.copy(
            enable_thinking=getattr(data_args, "enable_thinking", True),
            preserve_thinking=getattr(data_args, "preserve_thinking", False),
        )

    template.fix_special_tokens(tokenizer)
    if getattr(tokenizer, "chat_template", None) is None or template.replace_jinja_template:
        tokenizer.chat_template = template.jinja_chat_template(tokenizer)
    elif name is not None:
        _warn_if_chat_template_disagrees(template, tokenizer)
    return template


def _warn_if_chat_template_disagrees(template: Template, tokenizer) -> None:
    """The tokenizer keeps its own chat_template (as in LLaMA-Factory) and is saved with it: say so when a server
    rendering it would prompt the model differently from how it is trained."""
    from lathe.llm.templates.check import chat_template_differences

    differences = chat_template_differences(template, tokenizer)
    if differences:
        logger.warning(
            "The tokenizer's own chat_template, which is saved with the model, renders conversations "
            "differently from template %r (`lathe data preview` shows how):\n%s",
            template.name,
            differences[0].describe(),
        )
