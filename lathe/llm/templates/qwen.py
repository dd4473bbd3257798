"""Qwen (2/2.5) ChatML with Qwen's default system text and tool format; `qwen3` / `qwen3_nothink` add
<think> handling (qwen3 adds an empty thought to answers that have none)."""
from lathe.llm.templates.template import Template

_CHATML = dict(
    user=("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n",),
    assistant=("{{content}}<|im_end|>\n",),
    system=("<|im_start|>system\n{{content}}<|im_end|>\n",),
    function=("{{content}}<|im_end|>\n",),
    # tool results go back as a user turn, wrapped in <tool_response>
    observation=(
        "<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    ),
    tool_format="qwen",
    stop_words=("<|im_end|>",),
    replace_eos=True,
)

TEMPLATES = [
    Template(
        name="qwen", default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", **_CHATML
    ),
    Template(name="qwen3", reasoning=True, **_CHATML),
    Template(name="qwen3_nothink", **_CHATML),
]
