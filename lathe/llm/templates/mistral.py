"""Mistral (v3 tokenizer) [INST] format: the system text is prepended to the first user message; tool
calls follow [TOOL_CALLS], tool results are wrapped in [TOOL_RESULTS]. `llama2` shares the layout."""
from lathe.llm.templates.template import BOS, EOS, Template

TEMPLATES = [
    Template(
        name="mistral",
        user=("[INST] {{content}}[/INST]",),
        assistant=(" {{content}}", EOS),
        system=("{{content}}\n\n",),
        function=("[TOOL_CALLS] {{content}}", EOS),
        observation=('[TOOL_RESULTS] {"content": {{content}}}[/TOOL_RESULTS]',),
        prefix=(BOS,),
        tool_format="mistral",
        system_in_first_user=True,
    ),
    Template(
        name="llama2",
        user=(BOS, "[INST] {{content}} [/INST]"),
        system=("<<SYS>>\n{{content}}\n<</SYS>>\n\n",),
        system_in_first_user=True,
    ),
]
