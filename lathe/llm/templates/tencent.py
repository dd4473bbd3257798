"""Tencent: Hunyuan (hunyuan, hunyuan_small, the reasoning hy3) and Youtu (the reasoning youtu, youtu_vl)."""

from lathe.llm.templates.template import BOS, Template

TEMPLATES = [
    Template(
        name="hunyuan",
        user=("{{content}}<|extra_0|>",),
        assistant=("{{content}}<|eos|>",),
        system=("{{content}}<|extra_4|>",),
        prefix=("<|startoftext|>",),
        stop_words=("<|eos|>",),
    ),
    Template(
        name="hunyuan_small",
        user=("<｜hy_User｜>{{content}}<｜hy_place▁holder▁no▁8｜>",),
        assistant=("{{content}}<｜hy_place▁holder▁no▁2｜>",),
        system=("{{content}}<｜hy_place▁holder▁no▁3｜>",),
        prefix=("<｜hy_begin▁of▁sentence｜>",),
        stop_words=("<｜hy_place▁holder▁no▁2｜>",),
    ),
    Template(
        name="hy3",
        user=("<｜hy_User｜>{{content}}<｜hy_Assistant｜>",),
        assistant=("{{content}}<｜hy_eos｜>",),
        prefix=(BOS,),
        stop_words=("<｜hy_eos｜>",),
        replace_eos=True,
        thought_words=("<think>", "</think>"),
        reasoning=True,
    ),
    Template(
        name="youtu",
        user=("<|User|>{{content}}<|Assistant|>",),
        assistant=("{{content}}<|end_of_text|>",),
        function=("{{content}}",),
        observation=("<tool_response>\n{{content}}\n</tool_response><|Assistant|>",),
        prefix=(BOS,),
        stop_words=("<|end_of_text|>",),
        replace_eos=True,
        reasoning=True,
    ),
    Template(
        name="youtu_vl",
        user=("<|begin_of_text|>user\n{{content}}<|end_of_text|>\n<|begin_of_text|>assistant\n",),
        assistant=("{{content}}<|end_of_text|>\n",),
        system=("<|begin_of_text|>system\n{{content}}<|end_of_text|>\n",),
        default_system="You are a helpful assistant.",
        stop_words=("<|end_of_text|>",),
        multimodal="youtu_vl",
    ),
]
