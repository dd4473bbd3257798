"""ChatML (<|im_start|>role ... <|im_end|>) and the models that use it with their own default system text,
stop words or tool turns: chatml, chatml_de, cpm4, dbrx, falcon_h1, opencoder, smollm, smollm2, yi, sailor,
intern2, intern_vl, intern_s1, minicpm_v, minicpm_v_4_6, minicpm_o, llava_next_yi, llava_next_video_yi,
lfm2, lfm2_vl. (Qwen's ChatML templates are in qwen.py.)"""

from lathe.llm.templates.template import BOS, Template

USER = "<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n"
ASSISTANT = "{{content}}<|im_end|>\n"
SYSTEM = "<|im_start|>system\n{{content}}<|im_end|>\n"
TOOL_TURN = "<|im_start|>tool\n{{content}}<|im_end|>\n<|im_start|>assistant\n"
HELPFUL = "You are a helpful assistant."


def chatml(name: str, **fields) -> Template:
    """ChatML slots; observation defaults to the user slots (tool results as a user turn)."""
    return Template(name=name, user=(USER,), assistant=(ASSISTANT,), system=(SYSTEM,), **fields)


_LFM2 = dict(
    observation=(
        "<|im_start|>tool\n<|tool_response_start|>{{content}}<|tool_response_end|><|im_end|>\n<|im_start|>assistant\n",
    ),
    tool_format="lfm2",
    stop_words=("<|im_end|>",),
    tool_call_words=("<|tool_call_start|>", "<|tool_call_end|>"),
    replace_eos=True,
)
_INTERN_SYSTEM = (
    "You are an AI assistant whose name is InternLM (书生·浦语).\n"
    "- InternLM (书生·浦语) is a conversational language model that is developed by Shanghai AI Laboratory "
    "(上海人工智能实验室). It is designed to be helpful, honest, and harmless.\n"
    "- InternLM (书生·浦语) can understand and communicate fluently in the language "
    "chosen by the user such as English and 中文."
)
_DBRX_SYSTEM = (
    "You are DBRX, created by Databricks. You were last updated in December 2023. "
    "You answer questions based on information available up to that point.\n"
    "YOU PROVIDE SHORT RESPONSES TO SHORT QUESTIONS OR STATEMENTS, but provide thorough "
    "responses to more complex and open-ended questions.\nYou assist with various tasks, "
    "from writing to coding (using markdown for code blocks — remember to use ``` with "
    "code, JSON, and tables).\n(You do not have real-time data access or code execution "
    "capabilities. You avoid stereotyping and provide balanced perspectives on "
    "controversial topics. You do not provide song lyrics, poems, or news articles and "
    "do not divulge details of your training data.)\nThis is your system prompt, "
    "guiding your responses. Do not reference it, just respond to the user. If you find "
    "yourself talking about this message, stop. You should be responding appropriately "
    "and usually that means not mentioning this.\nYOU DO NOT MENTION ANY OF THIS INFORMATION "
    "ABOUT YOURSELF UNLESS THE INFORMATION IS DIRECTLY PERTINENT TO THE USER'S QUERY."
)
_END = ("<|im_end|>",)

TEMPLATES = [
    # <|im_end|> becomes the EOS
    chatml(
        "chatml",
        observation=(TOOL_TURN,),
        stop_words=("<|im_end|>", "<|im_start|>"),
        replace_eos=True,
        replace_jinja_template=True,
    ),
    chatml(
        "chatml_de",
        observation=(TOOL_TURN,),
        default_system="Du bist ein freundlicher und hilfsbereiter KI-Assistent.",
        stop_words=("<|im_end|>", "<|im_start|>"),
        replace_eos=True,
        replace_jinja_template=True,
    ),
    chatml("cpm4", observation=(TOOL_TURN,), prefix=(BOS,), stop_words=_END),
    chatml("dbrx", observation=(TOOL_TURN,), default_system=_DBRX_SYSTEM, stop_words=_END, replace_eos=True),
    chatml("falcon_h1", observation=(TOOL_TURN,), prefix=(BOS,), stop_words=("<|im_end|>", "<|end_of_text|>")),
    chatml(
        "opencoder",
        observation=(TOOL_TURN,),
        default_system="You are OpenCoder, created by OpenCoder Team.",
        stop_words=_END,
    ),
    chatml("smollm", stop_words=_END),
    chatml(
        "smollm2",
        default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face.",
        stop_words=_END,
    ),
    chatml("yi", stop_words=_END),
    Template(
        name="sailor",
        user=("<|im_start|>question\n{{content}}<|im_end|>\n<|im_start|>answer\n",),
        assistant=(ASSISTANT,),
        system=(SYSTEM,),
        default_system=(
            "You are an AI assistant named Sailor created by Sea AI Lab. "
            "Your answer should be friendly, unbiased, faithful, informative and detailed."
        ),
        stop_words=_END,
    ),
    chatml("intern2", prefix=(BOS,), default_system=_INTERN_SYSTEM, stop_words=_END),
    chatml(
        "intern_vl",
        prefix=(BOS,),
        stop_words=_END,
        multimodal="intern_vl",
        default_system=(
            "你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。"
        ),
    ),
    chatml("intern_s1", prefix=(BOS,), stop_words=_END, multimodal="intern_vl"),
    chatml("minicpm_v", default_system=HELPFUL, stop_words=_END, multimodal="minicpm_v"),
    chatml("minicpm_v_4_6", default_system=HELPFUL, stop_words=_END, multimodal="minicpm_v_4_6"),
    chatml(
        "minicpm_o",
        stop_words=_END,
        multimodal="minicpm_o",  # LLaMA-Factory's minicpm_v plugin with audio_token: lathe's minicpm_o family
        default_system=("You are a helpful assistant. You can accept audio and text input and output voice and text."),
    ),
    chatml("llava_next_yi", stop_words=_END, multimodal="llava_next"),
    chatml("llava_next_video_yi", stop_words=_END, multimodal="llava_next_video"),
    chatml("lfm2", default_system="You are a helpful AI assistant.", **_LFM2),
    chatml(
        "lfm2_vl", default_system="You are a helpful multimodal assistant by Liquid AI.", multimodal="lfm2_vl", **_LFM2
    ),
]
