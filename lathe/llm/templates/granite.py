"""IBM Granite: <|start_of_role|>role<|end_of_role|> turns closed by <|end_of_text|> (granite3, granite4) and
granite3_vision's <|user|> / <|assistant|> lines."""

from lathe.llm.templates.template import Template


def _role(role: str) -> str:
    return f"<|start_of_role|>{role}<|end_of_role|>"


_GRANITE = dict(
    user=(_role("user") + "{{content}}<|end_of_text|>\n" + _role("assistant"),),
    assistant=("{{content}}<|end_of_text|>\n",),
    system=(_role("system") + "{{content}}<|end_of_text|>\n",),
)

TEMPLATES = [
    Template(name="granite3", **_GRANITE),
    Template(
        name="granite4",
        # the tool turn ends with "assistant\n", not the assistant role header (as LLaMA-Factory 0.9.5 writes it)
        observation=(_role("tool") + "{{content}}<|end_of_text|>\n<|start_of_role|>assistant\n",),
        stop_words=("<|end_of_text|>",),
        default_system="You are Granite, developed by IBM. You are a helpful AI assistant.",
        **_GRANITE,
    ),
    Template(
        name="granite3_vision",
        user=("<|user|>\n{{content}}\n<|assistant|>\n",),
        system=("<|system|>\n{{content}}\n",),
        default_system=(
            "A chat between a curious user and an artificial intelligence assistant. "
            "The assistant gives helpful, detailed, and polite answers to the user's questions."
        ),
        multimodal="llava_next",
    ),
]
