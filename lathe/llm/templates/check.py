"""Does a chat_template render what the training template trains on? Probe conversations rendered both ways,
the differences found, the registered templates a chat_template matches, and the report `lathe data preview`
prints (template, EOS, PAD, stop tokens, the chat_template's agreement).

The comparison is on text, as a server renders it (`apply_chat_template(..., tokenize=False)`) against the
template's `render_oneturn`: the whole conversation, and the prompt generation starts from.
"""

from __future__ import annotations

from dataclasses import dataclass

PROBES = [
    ("", [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "Four."}]),
    (
        "Be brief.",
        [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "What is two plus two?"},
            {"role": "assistant", "content": "Four."},
        ],
    ),
]


@dataclass
class Difference:
    conversation: list[dict]
    what: str  # "conversation" or "generation prompt"
    expected: str  # what the training template renders
    rendered: str  # what the chat_template renders (or the error it raised)

    def describe(self) -> str:
        return (
            f"{self.what} of {self.conversation!r}:\n  training template: {self.expected!r}\n"
            f"  chat_template:     {self.rendered!r}"
        )


def _chat(system: str, messages: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + list(messages)


def _render(tokenizer, chat, generation: bool) -> str:
    try:
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation)
    except Exception as error:  # a template that raises on the probe disagrees by definition
        return f"<error: {type(error).__name__}: {error}>"


def chat_template_differences(template, tokenizer, probes=PROBES) -> list[Difference]:
    """Where the tokenizer's chat_template renders a probe conversation differently from the template."""
    differences = []
    for system, messages in probes:
        prompt, answer = template.render_oneturn(tokenizer, messages, system)
        rendered = _render(tokenizer, _chat(system, messages), False)
        if rendered != prompt + answer:
            differences.append(Difference(_chat(system, messages), "conversation", prompt + answer, rendered))
        prompt, _ = template.render_oneturn(tokenizer, messages[:-1] + [{"role": "assistant", "content": ""}], system)
        rendered = _render(tokenizer, _chat(system, messages[:-1]), True)
        if rendered != prompt:
            differences.append(Difference(_chat(system, messages[:-1]), "generation prompt", prompt, rendered))
    return differences


def matching_templates(tokenizer) -> list[str]:
    """The registered templates whose rendering the tokenizer's chat_template reproduces on the probes."""
    from lathe.llm.templates.registry import TEMPLATES

    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        return []
    return [name for name, template in sorted(TEMPLATES.items()) if not chat_template_differences(template, tokenizer)]


def _token_text(tokenizer, token_id) -> str:
    return tokenizer.convert_ids_to_tokens(token_id) if token_id is not None else "(none)"


def template_report(template, tokenizer, chat_template=None) -> str:
    """The template, the special tokens training and generation use, and whether `chat_template` (the
    tokenizer's own by default: what is saved with the model) renders as the template trains."""
    stops = template.get_stop_token_ids(tokenizer)
    lines = [
        f"template: {template.name}"
        + (" (efficient_eos: EOS trained where the next prompt starts)" if template.efficient_eos else ""),
        f"EOS: {tokenizer.eos_token!r} ({tokenizer.eos_token_id}); PAD: {tokenizer.pad_token!r} ({tokenizer.pad_token_id})",
        "stop tokens (generation_config eos_token_id): "
        + ", ".join(f"{_token_text(tokenizer, i)!r} ({i})" for i in stops),
    ]
    if template.reasoning:
        lines.append(
            f"reasoning: enable_thinking={template.enable_thinking}, empty thought {template.empty_thought_text()!r}"
        )
    saved = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    if not isinstance(saved, str):
        lines.append("chat_template: none (servers cannot render conversations for this model)")
        return "\n".join(lines)
    previous, tokenizer.chat_template = tokenizer.chat_template, saved
    try:
        differences = chat_template_differences(template, tokenizer)
    finally:
        tokenizer.chat_template = previous
    if not differences:
        lines.append("chat_template: renders the probe conversations exactly as the template trains on them")
    else:
        lines.append(
            f"WARNING: the chat_template saved with the model disagrees with the training template on "
            f"{len(differences)} probe(s): a server would prompt the model differently from training."
        )
        lines += ["  " + difference.describe().replace("\n", "\n  ") for difference in differences]
    return "\n".join(lines)
