"""Llama: Llama 2's [INST] with <<SYS>> (llama2, llama2_zh); Llama 3.x's header tokens, where <|eot_id|>
ends a turn (and becomes the EOS) and tool results come back as the `ipython` role (llama3, mllama,
llava_next_llama3); Llama 4's (llama4); openchat-3.6 on Llama 3's tokens."""

from lathe.llm.templates.template import BOS, Template

_LLAMA2 = dict(
    user=(BOS, "[INST] {{content}} [/INST]"), system=("<<SYS>>\n{{content}}\n<</SYS>>\n\n",), system_in_first_user=True
)


def _headers(name: str, start: str, end: str, eot: str, eom: str, **fields) -> Template:
    def turn(role: str) -> str:
        return f"{start}{role}{end}\n\n"

    return Template(
        name=name,
        user=(turn("user") + "{{content}}" + eot + turn("assistant"),),
        assistant=("{{content}}" + eot,),
        system=(turn("system") + "{{content}}" + eot,),
        function=("{{content}}" + eot,),
        observation=(turn("ipython") + "{{content}}" + eot + turn("assistant"),),
        prefix=(BOS,),
        tool_format="llama3",
        stop_words=(eot, eom),
        replace_eos=True,
        **fields,
    )


_LLAMA3 = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>")

TEMPLATES = [
    Template(name="llama2", **_LLAMA2),
    Template(name="llama2_zh", default_system="You are a helpful assistant. 你是一个乐于助人的助手。", **_LLAMA2),
    _headers("llama3", *_LLAMA3),
    _headers("mllama", *_LLAMA3, multimodal="mllama"),
    _headers("llava_next_llama3", *_LLAMA3, multimodal="llava_next"),
    _headers("llama4", "<|header_start|>", "<|header_end|>", "<|eot|>", "<|eom|>", multimodal="llama4"),
    Template(
        name="openchat-3.6",
        user=(
            "<|start_header_id|>GPT4 Correct User<|end_header_id|>\n\n{{content}}<|eot_id|>"
            "<|start_header_id|>GPT4 Correct Assistant<|end_header_id|>\n\n",
        ),
        prefix=(BOS,),
        stop_words=("<|eot_id|>",),
    ),
]
