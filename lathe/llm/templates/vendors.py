"""Templates of model families with one or two each, one block per vendor: Ant (bailing, bailing_v2),
Baidu (ernie, ernie_nothink, ernie_vl), ByteDance (seed_coder, seed_oss), Cohere (cohere), LG (exaone),
Moonshot (kimi_vl, moonlight), MiniMax (minimax1, minimax2), OpenAI (gpt_oss), Rednote (dots_ocr),
and community models (index, olmo, openchat, starchat, telechat2, yuan, zephyr)."""

from lathe.llm.templates.template import BOS, EOS, SpecialToken, Template

_SEED = dict(user=(BOS, "user\n{{content}}", EOS, BOS, "assistant\n"), system=(BOS, "system\n{{content}}", EOS))
_KIMI = dict(
    user=("<|im_user|>user<|im_middle|>{{content}}<|im_end|><|im_assistant|>assistant<|im_middle|>",),
    assistant=("{{content}}<|im_end|>",),
    system=("<|im_system|>system<|im_middle|>{{content}}<|im_end|>",),
    stop_words=("<|im_end|>",),
)

ANT = [
    Template(
        name="bailing",
        user=("<role>HUMAN</role>{{content}}<role>ASSISTANT</role>",),
        system=("<role>SYSTEM</role>{{content}}",),
        observation=("<role>OBSERVATION</role>{{content}}<role>ASSISTANT</role>",),
        stop_words=("<|endoftext|>",),
        efficient_eos=True,
    ),
    Template(
        name="bailing_v2",
        user=("<role>HUMAN</role>{{content}}<|role_end|><role>ASSISTANT</role>",),
        assistant=("{{content}}<|role_end|>",),
        system=("<role>SYSTEM</role>{{content}}<|role_end|>",),
        observation=(
            "<role>OBSERVATION</role>\n<tool_response>\n{{content}}\n</tool_response><|role_end|>"
            "<role>ASSISTANT</role>",
        ),
        tool_format="ling",
        stop_words=("<|endoftext|>",),
        efficient_eos=True,
    ),
]
BAIDU = [
    Template(
        name="ernie",
        user=("<|im_start|>user\n{{content}}<|im_end|>\n\n<|im_start|>assistant\n",),
        assistant=("{{content}}<|im_end|>\n\n",),
        system=("<|im_start|>system\n{{content}}<|im_end|>\n\n",),
        observation=("<|im_start|>tool\n{{content}}<|im_end|>\n\n<|im_start|>assistant\n",),
        default_system="<global_setting>\nthink_mode=True\n</global_setting>",
        stop_words=("<|im_end|>",),
    ),
    Template(
        name="ernie_nothink",
        user=("User: {{content}}\nAssistant: ",),
        assistant=("{{content}}<|end_of_sentence|>",),
        system=("{{content}}\n",),
        prefix=("<|begin_of_sentence|>",),
        stop_words=("<|end_of_sentence|>",),
    ),
    Template(
        name="ernie_vl",
        user=("User: {{content}}",),
        assistant=("\nAssistant: {{content}}<|end_of_sentence|>",),
        system=("{{content}}\n",),
        stop_words=("<|end_of_sentence|>",),
        replace_eos=True,
        replace_jinja_template=True,
        reasoning=True,
        multimodal="ernie_vl",
    ),
]
BYTEDANCE = [
    Template(
        name="seed_coder",
        default_system=(
            "You are an AI programming assistant, utilizing the Seed-Coder model, developed by ByteDance Seed, "
            "and you only answer questions related to computer science. For politically sensitive questions, "
            "security and privacy issues, and other non-computer science questions, you will refuse to answer.\n\n"
        ),
        **_SEED,
    ),
    Template(
        name="seed_oss",
        function=(BOS, "\n{{content}}", EOS),
        tool_format="seed_oss",
        thought_words=("<seed:think>", "</seed:think>"),
        reasoning=True,
        **_SEED,
    ),
]
COHERE = [
    Template(
        name="cohere",
        user=(
            "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{content}}<|END_OF_TURN_TOKEN|>"
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        ),
        system=("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{{content}}<|END_OF_TURN_TOKEN|>",),
        prefix=(BOS,),
    ),
]
LG = [
    Template(
        name="exaone",
        user=("[|user|]{{content}}\n[|assistant|]",),
        assistant=("{{content}}", EOS, "\n"),
        system=("[|system|]{{content}}[|endofturn|]\n",),
    ),
]
MOONSHOT = [
    Template(
        name="kimi_vl",
        default_system="You are a helpful assistant",
        thought_words=("◁think▷", "◁/think▷"),
        reasoning=True,
        multimodal="kimi_vl",
        **_KIMI,
    ),
    Template(
        name="moonlight",
        default_system="You are a helpful assistant provided by Moonshot-AI.",
        replace_eos=True,
        **_KIMI,
    ),
]
MINIMAX = [
    Template(
        name="minimax1",
        user=(
            "<beginning_of_sentence>user name=user\n{{content}}<end_of_sentence>\n"
            "<beginning_of_sentence>ai name=assistant\n",
        ),
        assistant=("{{content}}<end_of_sentence>\n",),
        system=("<beginning_of_sentence>system ai_setting=assistant\n{{content}}<end_of_sentence>\n",),
        observation=(
            "<beginning_of_sentence>tool name=tools\n{{content}}<end_of_sentence>\n"
            "<beginning_of_sentence>ai name=assistant\n",
        ),
        tool_format="minimax1",
        default_system="You are a helpful assistant.",
        stop_words=("<end_of_sentence>",),
    ),
    Template(
        name="minimax2",
        user=("]~b]user\n{{content}}[e~[\n]~b]ai\n",),
        assistant=("{{content}}[e~[\n",),
        system=("]~!b[]~b]system\n{{content}}[e~[\n",),
        observation=("]~b]tool\n<response>{{content}}</response>[e~[\n]~b]ai\n",),
        tool_format="minimax2",
        default_system="You are a helpful assistant. Your name is MiniMax-M2.1 and is built by MiniMax.",
        stop_words=("[e~[",),
        reasoning=True,
    ),
]
OPENAI = [
    # the thought is the analysis channel; the final answer follows in the final channel
    Template(
        name="gpt_oss",
        user=("<|start|>user<|message|>{{content}}<|end|><|start|>assistant",),
        assistant=("{{content}}",),
        system=("<|start|>system<|message|>{{content}}<|end|>",),
        default_system="You are ChatGPT, a large language model trained by OpenAI.",
        thought_words=("<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final<|message|>"),
        efficient_eos=True,
        reasoning=True,
    ),
]
REDNOTE = [
    Template(
        name="dots_ocr",
        user=("<|user|>{{content}}<|endofuser|><|assistant|>",),
        assistant=("{{content}}<|endofassistant|>",),
        system=("<|system|>{{content}}<|endofsystem|>\n",),
        stop_words=("<|endofassistant|>",),
        efficient_eos=True,
        multimodal="qwen2_vl",
    ),
]
COMMUNITY = [
    Template(name="index", user=("reserved_0{{content}}reserved_1",), system=("<unk>{{content}}",), efficient_eos=True),
    Template(name="olmo", user=("<|user|>\n{{content}}<|assistant|>\n",), prefix=(EOS,)),
    Template(name="openchat", user=("GPT4 Correct User: {{content}}", EOS, "GPT4 Correct Assistant:"), prefix=(BOS,)),
    Template(
        name="starchat",
        user=("<|user|>\n{{content}}<|end|>\n<|assistant|>",),
        assistant=("{{content}}<|end|>\n",),
        system=("<|system|>\n{{content}}<|end|>\n",),
        stop_words=("<|end|>",),
    ),
    Template(
        name="telechat2",
        user=("<_user>{{content}}<_bot>",),
        system=("<_system>{{content}}",),
        default_system=(
            "你是中国电信星辰语义大模型，英文名是TeleChat，你是由中电信人工智能科技有限公司和中国电信人工智能研究院（TeleAI）研发的人工智能助手。"
        ),
    ),
    Template(
        name="yuan",
        user=("{{content}}", SpecialToken("token", "<sep>")),
        assistant=("{{content}}<eod>\n",),
        stop_words=("<eod>",),
    ),
    Template(
        name="zephyr",
        user=("<|user|>\n{{content}}", EOS, "<|assistant|>\n"),
        system=("<|system|>\n{{content}}", EOS),
        default_system="You are Zephyr, a helpful assistant.",
    ),
]

TEMPLATES = ANT + BAIDU + BYTEDANCE + COHERE + LG + MOONSHOT + MINIMAX + OPENAI + REDNOTE + COMMUNITY
