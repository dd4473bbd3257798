"""Microsoft Phi: <|user|> / <|assistant|> turns closed by <|end|> (phi, phi_small, phi4_mini, where the raw
tool list goes between <|tool|> and <|/tool|>) and Phi-4's <|im_start|>role<|im_sep|> turns (phi4)."""

from lathe.llm.templates.template import Template

_PHI = dict(
    user=("<|user|>\n{{content}}<|end|>\n<|assistant|>\n",),
    assistant=("{{content}}<|end|>\n",),
    system=("<|system|>\n{{content}}<|end|>\n",),
    stop_words=("<|end|>",),
    replace_eos=True,
)

TEMPLATES = [
    Template(name="phi", **_PHI),
    # LLaMA-Factory 0.9.5 declares an <|endoftext|> prefix for phi_small in a form its encoder skips
    # (a set holding neither bos_token nor eos_token): no prefix token is written, and lathe writes none.
    Template(name="phi_small", **_PHI),
    Template(
        name="phi4",
        user=("<|im_start|>user<|im_sep|>{{content}}<|im_end|><|im_start|>assistant<|im_sep|>",),
        assistant=("{{content}}<|im_end|>",),
        system=("<|im_start|>system<|im_sep|>{{content}}<|im_end|>",),
        stop_words=("<|im_end|>",),
        replace_eos=True,
    ),
    Template(
        name="phi4_mini",
        user=("<|user|>{{content}}<|end|><|assistant|>",),
        assistant=("{{content}}<|end|>",),
        system=("<|system|>{{content}}<|end|>",),
        raw_tools_slot="<|tool|>{{content}}<|/tool|>",
        stop_words=("<|end|>",),
        replace_eos=True,
    ),
]
