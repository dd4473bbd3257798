"""Formats that mark roles with plain text ("Human:", "USER:", "### Instruction:"): default, empty, alpaca,
fewshot, vicuna and the LLaVA templates built on it, xuanyuan, solar, falcon, yi_vl."""

from lathe.llm.templates.template import EOS, Template

_VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)


def _vicuna(name: str, **fields) -> Template:
    return Template(name=name, user=("USER: {{content}} ASSISTANT:",), default_system=_VICUNA_SYSTEM, **fields)


TEMPLATES = [
    Template(
        name="default",
        user=("Human: {{content}}", EOS, "\nAssistant:"),
        assistant=("{{content}}", EOS, "\n"),
        system=("System: {{content}}", EOS, "\n"),
        replace_jinja_template=True,
    ),
    # the raw text of each message, nothing around it and no EOS (also the fallback when no template is
    # named and the tokenizer has no chat_template)
    Template(name="empty", assistant=("{{content}}",)),
    Template(
        name="alpaca",
        user=("### Instruction:\n{{content}}\n\n### Response:\n",),
        assistant=("{{content}}", EOS, "\n\n"),
        default_system=(
            "Below is an instruction that describes a task. "
            "Write a response that appropriately completes the request.\n\n"
        ),
        replace_jinja_template=True,
    ),
    Template(name="fewshot", assistant=("{{content}}\n\n",), efficient_eos=True, replace_jinja_template=True),
    _vicuna("vicuna", replace_jinja_template=True),
    _vicuna("llava", multimodal="llava"),
    _vicuna("llava_next", multimodal="llava_next"),
    _vicuna("llava_next_video", multimodal="llava_next_video"),
    _vicuna("video_llava", multimodal="video_llava"),
    Template(
        name="xuanyuan",
        user=("Human: {{content}} Assistant:",),
        default_system=(
            "以下是用户和人工智能助手之间的对话。用户以Human开头，人工智能助手以Assistant开头，"
            "会对人类提出的问题给出有帮助、高质量、详细和礼貌的回答，并且总是拒绝参与与不道德、"
            "不安全、有争议、政治敏感等相关的话题、问题和指示。\n"
        ),
    ),
    Template(
        name="solar",
        user=("### User:\n{{content}}\n\n### Assistant:\n",),
        system=("### System:\n{{content}}\n\n",),
        efficient_eos=True,
    ),
    Template(name="falcon", user=("User: {{content}}\nFalcon:",), assistant=("{{content}}\n",), efficient_eos=True),
    Template(
        name="yi_vl",
        user=("### Human: {{content}}\n### Assistant:",),
        assistant=("{{content}}\n",),
        default_system=(
            "This is a chat between an inquisitive human and an AI assistant. "
            "Assume the role of the AI assistant. Read all the images carefully, "
            "and respond to the human's questions with informative, helpful, detailed and polite answers. "
            "这是一个好奇的人类和一个人工智能助手之间的对话。假设你扮演这个AI助手的角色。"
            "仔细阅读所有的图像，并对人类的问题做出信息丰富、有帮助、详细的和礼貌的回答。\n\n"
        ),
        stop_words=("###",),
        efficient_eos=True,
        multimodal="llava",
    ),
]
