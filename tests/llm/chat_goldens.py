"""Hand-written goldens for the built-in templates on the word-level test tokenizer (conftest.build_word_tokenizer).

A spec lists the expected tokens separated by spaces ("↵" is the newline token); « » encloses a prompt
span (labels -100), what follows a prompt up to the next « is that turn's answer (trained). So one spec
gives both `encode_multiturn`'s (prompt, answer) pairs and the supervised (input_ids, labels).
`{TOOLS:<format>}` stands for the tokens of TOOL_TEXT[<format>], the tool description written out below.
Spaces are not tokens for this tokenizer, so "hi" and " hi" are the same token.
"""

import json

from lathe.llm.templates import Template

ADD_TOOL = {
    "name": "add",
    "description": "add two numbers",
    "parameters": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "first number"},
            "b": {"type": "integer", "description": "second number"},
        },
        "required": ["a", "b"],
    },
}
TOOLS = json.dumps([ADD_TOOL])
CALL = '{"name": "add", "arguments": {"a": 2, "b": 2}}'
LLAMA3_DATE = "26 Jul 2024"

# (system, tools, messages)
CONVERSATIONS = {
    "single": ("", "", [("user", "hi"), ("assistant", "hello")]),
    "system_multi": (
        "be brief",
        "",
        [("user", "hi"), ("assistant", "hello"), ("user", "two plus two ?"), ("assistant", "four")],
    ),
    "tools": (
        "",
        TOOLS,
        [("user", "add two plus two"), ("function", CALL), ("observation", "4"), ("assistant", "four")],
    ),
}

_WRAPPED = json.dumps({"type": "function", "function": ADD_TOOL})
TOOL_TEXT = {
    "default": (
        "You have access to the following tools:\n"
        "> Tool Name: add\nTool Description: add two numbers\nTool Args:\n"
        "  - a (integer, required): first number\n"
        "  - b (integer, required): second number\n\n"
        "Use the following format if using a tool:\n```\n"
        "Action: tool name (one of [add])\n"
        "Action Input: the input to the tool, in a JSON format representing the kwargs "
        '(e.g. ```{"input": "hello world", "num_beams": 5}```)\n```\n'
    ),
    "qwen": (
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + _WRAPPED
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call>"
    ),
    "llama3": (
        f"Cutting Knowledge Date: December 2023\nToday Date: {LLAMA3_DATE}\n\n"
        "You have access to the following functions. To call a function, please respond with JSON for a "
        'function call. Respond in the format {"name": function name, "parameters": dictionary of argument '
        "name and its value}. Do not use variables.\n\n"
        + json.dumps({"type": "function", "function": ADD_TOOL}, indent=4)
        + "\n\n"
    ),
    "mistral": "[AVAILABLE_TOOLS] [" + _WRAPPED + "][/AVAILABLE_TOOLS]",
}

ARGS = '{ " a " : 2 , " b " : 2 }'
DEFAULT_CALL = f"Action : add ↵ Action Input : {ARGS}"
ALPACA_SYSTEM = (
    "Below is an instruction that describes a task . Write a response that appropriately completes the request . ↵ ↵"
)
QWEN_SYSTEM = "You are Qwen , created by Alibaba Cloud . You are a helpful assistant ."


def _chatml(role, text):
    return f"<|im_start|> {role} ↵ {text} <|im_end|> ↵"


ASK = "<|im_start|> assistant ↵"


def _llama3(role, text):
    return f"<|start_header_id|> {role} <|end_header_id|> ↵ ↵ {text} <|eot_id|>"


ASK3 = "<|start_header_id|> assistant <|end_header_id|> ↵ ↵"

SPECS = {
    "default": {
        "single": "« Human : hi </s> ↵ Assistant : » hello </s> ↵",
        "system_multi": "« System : be brief </s> ↵ Human : hi </s> ↵ Assistant : » hello </s> ↵ "
        "« Human : two plus two ? </s> ↵ Assistant : » four </s> ↵",
        "tools": "« System : {TOOLS:default} </s> ↵ Human : add two plus two </s> ↵ Assistant : » "
        f"{DEFAULT_CALL} </s> ↵ « Human : 4 </s> ↵ Assistant : » four </s> ↵",
    },
    "empty": {  # no markers and no EOS at all
        "single": "« hi » hello",
        "system_multi": "« be brief hi » hello « two plus two ? » four",
        "tools": f"« {{TOOLS:default}} add two plus two » {DEFAULT_CALL} « 4 » four",
    },
    "alpaca": {  # the default system text when none is given
        "single": f"« {ALPACA_SYSTEM} # # # Instruction : ↵ hi ↵ ↵ # # # Response : ↵ » hello </s> ↵ ↵",
        "system_multi": "« be brief # # # Instruction : ↵ hi ↵ ↵ # # # Response : ↵ » hello </s> ↵ ↵ "
        "« # # # Instruction : ↵ two plus two ? ↵ ↵ # # # Response : ↵ » four </s> ↵ ↵",
        "tools": f"« {ALPACA_SYSTEM} {{TOOLS:default}} # # # Instruction : ↵ add two plus two ↵ ↵ "
        f"# # # Response : ↵ » {DEFAULT_CALL} </s> ↵ ↵ "
        "« # # # Instruction : ↵ 4 ↵ ↵ # # # Response : ↵ » four </s> ↵ ↵",
    },
    "chatml": {  # <|im_end|> replaces </s> as EOS; tool results are the `tool` role
        "single": f"« {_chatml('user', 'hi')} {ASK} » hello <|im_end|> ↵",
        "system_multi": f"« {_chatml('system', 'be brief')} {_chatml('user', 'hi')} {ASK} » hello <|im_end|> ↵ "
        f"« {_chatml('user', 'two plus two ?')} {ASK} » four <|im_end|> ↵",
        "tools": f"« {_chatml('system', '{TOOLS:default}')} {_chatml('user', 'add two plus two')} {ASK} » "
        f"{DEFAULT_CALL} <|im_end|> ↵ « {_chatml('tool', '4')} {ASK} » four <|im_end|> ↵",
    },
    "qwen": {  # Qwen's default system; tool results go back as a user turn in <tool_response>
        "single": f"« {_chatml('system', QWEN_SYSTEM)} {_chatml('user', 'hi')} {ASK} » hello <|im_end|> ↵",
        "system_multi": f"« {_chatml('system', 'be brief')} {_chatml('user', 'hi')} {ASK} » hello <|im_end|> ↵ "
        f"« {_chatml('user', 'two plus two ?')} {ASK} » four <|im_end|> ↵",
        "tools": f"« {_chatml('system', QWEN_SYSTEM + ' {TOOLS:qwen}')} {_chatml('user', 'add two plus two')} "
        f'{ASK} » <tool_call> ↵ {{ " name " : " add " , " arguments " : {ARGS} }} ↵ </tool_call> '
        f"<|im_end|> ↵ « {_chatml('user', '<tool_response> ↵ 4 ↵ </tool_response>')} {ASK} » "
        "four <|im_end|> ↵",
    },
    "llama3": {  # BOS first; <|eot_id|> replaces </s> as EOS; tool results are the `ipython` role
        "single": f"« <s> {_llama3('user', 'hi')} {ASK3} » hello <|eot_id|>",
        "system_multi": f"« <s> {_llama3('system', 'be brief')} {_llama3('user', 'hi')} {ASK3} » hello <|eot_id|> "
        f"« {_llama3('user', 'two plus two ?')} {ASK3} » four <|eot_id|>",
        "tools": f"« <s> {_llama3('system', '{TOOLS:llama3}')} {_llama3('user', 'add two plus two')} {ASK3} » "
        f'{{ " name " : " add " , " parameters " : {ARGS} }} <|eot_id|> '
        f"« {_llama3('ipython', '4')} {ASK3} » four <|eot_id|>",
    },
    "mistral": {  # the system text (and tool list) opens the first [INST]
        "single": "« <s> [INST] hi [/INST] » hello </s>",
        "system_multi": "« <s> [INST] be brief ↵ ↵ hi [/INST] » hello </s> « [INST] two plus two ? [/INST] » four </s>",
        "tools": "« <s> [INST] {TOOLS:mistral} ↵ ↵ add two plus two [/INST] » "
        f'[TOOL_CALLS] [ {{ " name " : " add " , " arguments " : {ARGS} }} ] </s> '
        '« [TOOL_RESULTS] { " content " : 4 } [/TOOL_RESULTS] » four </s>',
    },
}


def spec_tokens(tokenizer, spec: str) -> list[tuple[list[str], list[str]]]:
    """A spec -> [(prompt tokens, answer tokens)] per turn."""
    turns, current, in_prompt = [], None, False
    for word in spec.split():
        if word == "«":
            current, in_prompt = ([], []), True
            turns.append(current)
        elif word == "»":
            in_prompt = False
        elif word.startswith("{TOOLS:"):
            text = TOOL_TEXT[word[len("{TOOLS:") : -1]]
            current[0].extend(tokenizer.convert_ids_to_tokens(tokenizer.encode(text, add_special_tokens=False)))
        else:
            current[0 if in_prompt else 1].append("\n" if word == "↵" else word)
    return turns


def spec_ids(tokenizer, spec: str) -> list[tuple[list[int], list[int]]]:
    """A spec -> [(prompt ids, answer ids)], looking each token up in the vocabulary (not by encoding text)."""

    def ids(tokens):
        found = tokenizer.convert_tokens_to_ids(tokens)
        unknown = [t for t, i in zip(tokens, found) if i == tokenizer.unk_token_id and t != "<unk>"]
        assert not unknown, f"tokens missing from the test vocabulary: {unknown}"
        return found

    return [(ids(prompt), ids(answer)) for prompt, answer in spec_tokens(tokenizer, spec)]


def messages_of(conversation: str):
    system, tools, messages = CONVERSATIONS[conversation]
    return system, tools, [{"role": role, "content": content} for role, content in messages]


# Registered on both sides by the golden generator (no built-in name uses efficient_eos).
GOLDEN_EFFICIENT_EOS = Template(
    name="test_efficient_eos",
    user=("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n",),
    system=("<|im_start|>system\n{{content}}<|im_end|>\n",),
    observation=("<|im_start|>tool\n{{content}}<|im_end|>\n<|im_start|>assistant\n",),
    stop_words=("<|endoftext|>",),
    efficient_eos=True,
)
