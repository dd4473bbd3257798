"""get_template_and_fix_tokenizer: the template a run uses (a named one from the registry, or the tokenizer's
own chat_template parsed) with data_args' options applied, and the tokenizer fixed to match it. It sits above
the registry, the parser and the check, which it dispatches over."""

from __future__ import annotations

import logging

from lathe.llm.templates.registry import get_template
from lathe.llm.templates.template import EOS, Template
from lathe.llm.templates.tools import get_tool_format

logger = logging.getLogger("lathe.llm.templates")


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


_WARNED: set[tuple[str, str]] = set()  # (template, chat_template) pairs already warned about in this run


def forget_chat_template_warnings() -> None:
    """A new run warns again: `run_train` calls this first (a process may run several: the web UI, tests)."""
    _WARNED.clear()


def _warn_if_chat_template_disagrees(template: Template, tokenizer) -> None:
    """The tokenizer keeps its own chat_template (as in LLaMA-Factory) and is saved with it: say so, once per
    run (the tokenizer is loaded several times), when a server rendering it would prompt the model differently
    from how it is trained, with the one-line fix."""
    from lathe.llm.templates.check import chat_template_differences, matching_templates

    seen = (template.name, tokenizer.chat_template)
    if seen in _WARNED or not chat_template_differences(template, tokenizer):
        return
    _WARNED.add(seen)
    matches = [name for name in matching_templates(tokenizer) if name != template.name]
    fix = (
        f"template: {matches[0]} trains as the chat_template renders; or keep {template.name!r}"
        if matches
        else f"keep {template.name!r}"
    ) + " and serve the `lathe export`ed folder, which gets the template's own chat_template"
    logger.warning(
        "The tokenizer's own chat_template, saved with the model, renders conversations differently from "
        "template %r (`lathe data preview` shows how). Fix: %s.",
        template.name,
        fix,
    )
