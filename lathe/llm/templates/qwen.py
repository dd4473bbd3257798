"""Qwen: ChatML with Qwen's tool format (tool results as a user turn in <tool_response>). qwen (2 / 2.5),
the reasoning templates qwen3, qwen3_vl, qwen3_5, qwen3_6, qwen3_omni (an empty thought is added to
answers that have none) with their `_nothink` variants, the multimodal qwen2_vl, qwen2_audio, qwen2_omni,
and models built on Qwen: mimo, mimo_v2, mimo_vl, keye_vl, llava_next_qwen."""

from lathe.llm.templates.chatml import HELPFUL, chatml

_QWEN = dict(
    function=("{{content}}<|im_end|>\n",),
    observation=(
        "<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    ),
    tool_format="qwen",
    stop_words=("<|im_end|>",),
    replace_eos=True,
)
_QWEN35 = {**_QWEN, "tool_format": "qwen3_5"}

TEMPLATES = [
    chatml("qwen", default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", **_QWEN),
    chatml("qwen3", reasoning=True, **_QWEN),
    chatml("qwen3_nothink", **_QWEN),
    chatml("qwen2_vl", default_system=HELPFUL, multimodal="qwen2_vl", **_QWEN),
    chatml("qwen3_vl", reasoning=True, multimodal="qwen3_vl", **_QWEN),
    chatml("qwen3_vl_nothink", multimodal="qwen3_vl", **_QWEN),
    chatml("qwen3_5", reasoning=True, multimodal="qwen3_vl", **_QWEN35),
    chatml("qwen3_5_nothink", multimodal="qwen3_vl", **_QWEN35),
    chatml("qwen3_6", reasoning=True, multimodal="qwen3_vl", **_QWEN35),
    # qwen2_audio: tool results as a plain user turn and the default tool format
    chatml(
        "qwen2_audio", default_system=HELPFUL, stop_words=("<|im_end|>",), replace_eos=True, multimodal="qwen2_audio"
    ),
    chatml("qwen2_omni", default_system=HELPFUL, multimodal="qwen2_omni", **_QWEN),
    # LLaMA-Factory's qwen2_omni plugin with other tokens (<|image_pad|>, <|audio_start|>, ...): lathe's qwen3_omni
    chatml("qwen3_omni", reasoning=True, multimodal="qwen3_omni", **_QWEN),
    chatml("qwen3_omni_nothink", multimodal="qwen3_omni", **_QWEN),
    chatml("keye_vl", reasoning=True, multimodal="qwen2_vl", **_QWEN),
    chatml("mimo", default_system=HELPFUL, reasoning=True, **_QWEN),
    chatml(
        "mimo_v2",
        default_system="You are MiMo, a helpful AI assistant engineered by Xiaomi.",
        reasoning=True,
        thought_words=("<think>", "</think>"),
        **_QWEN,
    ),
    chatml(
        "mimo_vl",
        default_system="You are MiMo, an AI assistant developed by Xiaomi.",
        reasoning=True,
        multimodal="qwen2_vl",
        **_QWEN,
    ),
    chatml("llava_next_qwen", default_system=HELPFUL, multimodal="llava_next", **_QWEN),
]
