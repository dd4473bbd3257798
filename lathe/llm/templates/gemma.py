"""Gemma: <start_of_turn>user / model turns, the system text prepended to the first user message
(gemma, gemma2, gemma3, gemma3n, paligemma, paligemma_chat); Gemma 4's <|turn> format with its thought
channel and tool notation (gemma4, gemma4n)."""

from lathe.llm.templates.template import BOS, Template

_TURNS = dict(
    user=("<start_of_turn>user\n{{content}}<end_of_turn>\n<start_of_turn>model\n",),
    assistant=("{{content}}<end_of_turn>\n",),
    system=("{{content}}\n\n",),
    observation=("<start_of_turn>tool\n{{content}}<end_of_turn>\n<start_of_turn>model\n",),
    prefix=(BOS,),
    system_in_first_user=True,
)
_GEMMA4 = dict(
    user=("<|turn>user\n{{content}}<turn|>\n<|turn>model\n",),
    assistant=("{{content}}<turn|>\n",),
    system=("<|turn>system\n<|think|>{{content}}<turn|>\n",),
    observation=("<|turn>tool\n{{content}}<turn|>\n<|turn>model\n",),
    function=("<|tool>{{content}}<tool|>",),
    tool_format="gemma4",
    prefix=(BOS,),
    stop_words=("<turn|>",),
    default_system="You are a helpful assistant.",  # Gemma 4 thinks only with a system turn
    thought_words=("<|channel>thought\n", "<channel|>"),
    replace_eos=True,
    reasoning=True,
    multimodal="gemma4",
)

TEMPLATES = [
    Template(name="gemma", stop_words=("<end_of_turn>",), replace_eos=True, **_TURNS),
    # gemma2: <eos> stays the EOS; answers end with <end_of_turn> and the EOS is trained on the next prompt
    Template(name="gemma2", stop_words=("<eos>", "<end_of_turn>"), efficient_eos=True, **_TURNS),
    Template(name="gemma3", stop_words=("<end_of_turn>",), replace_eos=True, multimodal="gemma3", **_TURNS),
    Template(name="gemma3n", stop_words=("<end_of_turn>",), replace_eos=True, multimodal="gemma3n", **_TURNS),
    Template(name="gemma4", **_GEMMA4),
    # LLaMA-Factory's gemma4 plugin with an audio token: lathe's gemma4n family (the same plugin, audio too)
    Template(name="gemma4n", **{**_GEMMA4, "multimodal": "gemma4n"}),
    Template(
        name="paligemma", user=("{{content}}\n",), prefix=(BOS,), system_in_first_user=True, multimodal="paligemma"
    ),
    Template(
        name="paligemma_chat",
        stop_words=("<end_of_turn>",),
        replace_eos=True,
        multimodal="paligemma",
        **{**_TURNS, "system": ("{{content}}",)},
    ),
]
