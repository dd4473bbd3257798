"""A Template read from a tokenizer's own Jinja chat_template (used when the config names no template).

A chat_template that marks its assistant turns with {% generation %} is used as it is (rendered.py): its
masks are the trained spans. Otherwise, as LLaMA-Factory 0.9.5 does, the chat_template is rendered with a
`{{content}}` placeholder for a lone system message, a lone user message (with and without an empty
system message) and a user/assistant pair; the differences give the prefix, the slots and the default
system text. Unlike LLaMA-Factory, the result is then checked against the chat_template on probe
conversations, and where the slots do not reproduce it (system text merged into a later message, answers
rendered differently by position, a template that refuses a lone system message) lathe stops with an error
that names the templates that do match, instead of training on spans it guessed.
"""

from __future__ import annotations

from lathe.llm.templates.template import CONTENT, Template


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
    return long[start : len(long) - end]


def template_from_chat_template(tokenizer) -> Template:
    from lathe.llm.templates.check import chat_template_differences
    from lathe.llm.templates.rendered import RenderedTemplate, has_generation_blocks

    if has_generation_blocks(tokenizer.chat_template):
        return RenderedTemplate(name="(tokenizer chat_template, {% generation %} masks)")
    try:
        template = _parse_slots(tokenizer)
    except Exception as error:  # a placeholder that never comes out, a template that raises, ...
        raise cannot_find_spans(tokenizer, f"reading its slots failed: {error}") from None
    differences = chat_template_differences(template, tokenizer)
    if differences:
        raise cannot_find_spans(tokenizer, "the slots read from it do not reproduce it: " + differences[0].describe())
    return template


class UnreadableChatTemplate(ValueError):
    """A chat_template whose assistant turns lathe cannot find; `reason` says why (for other commands' words)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def cannot_find_spans(tokenizer, reason: str) -> ValueError:
    from lathe.llm.templates.check import matching_templates

    matches = matching_templates(tokenizer)
    hint = (
        f"it renders like these templates: {', '.join(matches)}"
        if matches
        else "no template lathe knows renders like it"
    )
    return UnreadableChatTemplate(
        "`template` is not set and lathe cannot find the assistant turns in the tokenizer's chat_template, so it "
        f"will not guess which tokens to train on ({reason}). Set `template` ({hint}), or use a chat_template "
        "that marks assistant turns with {% generation %} ... {% endgeneration %}.",
        reason,
    )


def _parse_slots(tokenizer) -> Template:
    def render(messages, generation_prompt):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        return text[len(prefix) :]

    prefix = tokenizer.decode(tokenizer.encode(""))
    system_slot = render([{"role": "system", "content": CONTENT}], False)
    user_after_empty_system = render([{"role": "system", "content": ""}, {"role": "user", "content": CONTENT}], True)
    user_slot = render([{"role": "user", "content": CONTENT}], True)
    pair = render([{"role": "user", "content": CONTENT}, {"role": "assistant", "content": CONTENT}], False)
    assistant_slot = pair[len(user_slot) :]
    reasoning = "<think>" in assistant_slot
    assistant_slot = assistant_slot.replace("<think>", "").replace("</think>", "").lstrip("\n")
    default_system = ""
    if len(user_slot) > len(user_after_empty_system):
        # The template writes a default system message when none is given: it is what the lone user
        # rendering has beyond the one with an empty system message.
        default_system = _inserted_text(user_after_empty_system, user_slot)
        user_slot = user_slot[len(system_slot.replace(CONTENT, default_system, 1)) :]
    return Template(
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
