"""Mistral's [INST] formats. The system text is prepended to the first user message (except
mistral_small's [SYSTEM_PROMPT]); tool calls follow [TOOL_CALLS], tool results are wrapped in
[TOOL_RESULTS]. mistral (v3 tokenizer: spaces around the content), ministral / ministral3 / pixtral
(tekken: no spaces), mistral_small, the LLaVA-NeXT Mistral templates, and breeze."""

from lathe.llm.templates.template import BOS, EOS, Template


def _inst(name: str, space: str, **fields) -> Template:
    """`space` is " " for the v3 SentencePiece tokenizer's layout and "" for tekken's."""
    fields.setdefault("system_in_first_user", True)
    return Template(
        name=name,
        user=(f"[INST]{space}{{{{content}}}}[/INST]",),
        assistant=(f"{space}{{{{content}}}}", EOS),
        system=("{{content}}\n\n",),
        function=(f"[TOOL_CALLS]{space}{{{{content}}}}", EOS),
        observation=(f'[TOOL_RESULTS]{space}{{"content": {{{{content}}}}}}[/TOOL_RESULTS]',),
        prefix=(BOS,),
        tool_format="mistral",
        **fields,
    )


TEMPLATES = [
    _inst("mistral", " "),
    _inst("llava_next_mistral", " ", multimodal="llava_next"),
    _inst("llava_next_video_mistral", " ", multimodal="llava_next_video"),
    _inst("ministral", ""),
    _inst("ministral3", "", multimodal="pixtral"),
    _inst("pixtral", "", multimodal="pixtral"),
    # the system prompt in its own [SYSTEM_PROMPT] block, not merged into the first user message
    _inst("mistral_small", "", system_in_first_user=False, multimodal="pixtral").copy(
        system=("[SYSTEM_PROMPT]{{content}}[/SYSTEM_PROMPT]",)
    ),
    Template(name="breeze", user=("[INST] {{content}} [/INST] ",), prefix=(BOS,), efficient_eos=True),
]
