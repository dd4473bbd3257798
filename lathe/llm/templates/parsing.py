"""A Template read from a tokenizer's own Jinja chat_template (used when the config names no template).

As LLaMA-Factory 0.9.5 does, the chat_template is rendered with a `{{content}}` placeholder for a lone
system message, a lone user message (with and without an empty system message) and a user/assistant
pair; the differences give the prefix, the slots and the default system text. Unlike LLaMA-Factory,
the result is checked against the tokenizer's own rendering of a probe conversation and a mismatch is
logged: a parsed template that trains on a format the chat_template does not produce is a silent bug.
"""
from __future__ import annotations

import logging

from lathe.llm.templates.template import CONTENT, Template

logger = logging.getLogger("lathe.llm.templates")


def _inserted_text(short: str, long: str) -> str:
    """The text `long` has in place of where `short` has nothing: what remains after removing their
    common beginning and common end. (LLaMA-Factory walks both strings greedily instead, which garbles
    the result when the inserted text shares characters with what follows it: "you are helpful"
    before " \n" came out as "youare helpful ".)"""
    start = 0
    while start < len(short) and short[start] == long[start]:
        start += 1
    end = 0
    while end < len(short) - start and short[-1 - end] == long[-1 - end]:
        end += 1
    return long[start:len(long) - end]


def template_from_chat_template(tokenizer) -> Template:
    def render(messages, generation_prompt):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        return text[len(prefix):]

    prefix = tokenizer.decode(tokenizer.encode(""))
    system_slot = render([{"role": "system", "content": CONTENT}], False)
    user_after_empty_system = render([{"role": "system", "content": ""}, {"role": "user", "content": CONTENT}], True)
    user_slot = render([{"role": "user", "content": CONTENT}], True)
    pair = render([{"role": "user", "content": CONTENT}, {"role": "assistant", "content": CONTENT}], False)
    assistant_slot = pair[len(user_slot):]
    reasoning = "<think>" in assistant_slot
    assistant_slot = assistant_slot.replace("<think>", "").replace("</think>", "").lstrip("\n")
    default_system = ""
    if len(user_slot) > len(user_after_empty_system):
        # The template writes a default system message when none is given: it is what the lone user
        # rendering has beyond the one with an empty system message.
        default_system = _inserted_text(user_after_empty_system, user_slot)
        user_slot = user_slot[len(system_slot.replace(CONTENT, default_system, 1)):]

    template = Template(
        name="(tokenizer chat_template)",
        user=(user_slot,),
        assistant=(assistant_slot,),
        system=(system_slot,),
        observation=(user_slot,),
        function=(assistant_slot,),
        prefix=(prefix,) if prefix else (),
        default_system=default_system,
        reasoning=reasoning,
    )
    _check_against_tokenizer(template, tokenizer)
    return template


def _check_against_tokenizer(template: Template, tokenizer) -> None:
    from lathe.llm.templates.jinja import special_token_text

    def text(slots, content):
        return "".join(
            s.replace(CONTENT, content, 1) if isinstance(s, str) else special_token_text(s, tokenizer) for s in slots
        )

    slots = {"system": template.system, "user": template.user, "assistant": template.assistant}
    turns = [("user", "U1"), ("assistant", "A1"), ("user", "U2"), ("assistant", "A2")]
    for system in ("S0", None):  # None: the default system text, if any, must appear as rendered
        probe = ([("system", system)] if system else []) + turns
        expected = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in probe], tokenize=False)
        shown = system or template.default_system
        parsed = text(template.prefix, "") + (text(template.system, shown) if shown else "")
        parsed += "".join(text(slots[role], content) for role, content in turns)
        if parsed != expected and not template.reasoning:
            logger.warning(
                "The template parsed from the tokenizer's chat_template does not reproduce it on a probe "
                "conversation; name a template explicitly. chat_template: %r; parsed: %r", expected, parsed
            )
            return
