"""Chat templates: hand-written goldens per template (single turn, system + multi-turn, tool calls and
results), tokenizer fixes (EOS, PAD, stop words), the registry, tool formats, chat_template parsing,
the Jinja export, and equality with LLaMA-Factory 0.9.5 (golden file made by
tests/llm/golden/make_llamafactory_golden.py)."""

import gzip
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from lathe.llm.templates import (  # noqa: E402
    TEMPLATES,
    InvalidMessage,
    Template,
    get_template,
    get_template_and_fix_tokenizer,
    template_names,
)
from lathe.llm.templates import tool_calls as tool_formats
from lathe.llm.templates import tools as tool_registry  # noqa: E402
from tests.llm.chat_goldens import (  # noqa: E402
    ADD_TOOL,
    CALL,
    GOLDEN_EFFICIENT_EOS,
    LLAMA3_DATE,
    SPECS,
    TOOL_TEXT,
    TOOLS,
    messages_of,
    spec_ids,
)

GOLDEN_DIR = Path(__file__).parent / "golden"
BUILT_IN = ["default", "empty", "alpaca", "chatml", "qwen", "llama3", "mistral"]


def data_args(template, **overrides):
    fields = dict(
        template=template,
        cutoff_len=1024,
        train_on_prompt=False,
        mask_history=False,
        tool_format=None,
        default_system=None,
        enable_thinking=True,
        preserve_thinking=False,
    )
    return SimpleNamespace(**{**fields, **overrides})


@pytest.fixture(autouse=True)
def pinned_llama3_date(monkeypatch):
    monkeypatch.setattr(tool_formats, "today", lambda: LLAMA3_DATE)


@pytest.mark.parametrize("conversation", ["single", "system_multi", "tools"])
@pytest.mark.parametrize("name", BUILT_IN)
def test_encode_multiturn_matches_hand_written_golden(word_tokenizer, name, conversation):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args(name))
    system, tools, messages = messages_of(conversation)
    encoded = template.encode_multiturn(word_tokenizer, messages, system, tools)
    assert encoded == spec_ids(word_tokenizer, SPECS[name][conversation])


@pytest.mark.parametrize("name", BUILT_IN)
def test_encode_oneturn_is_the_multiturn_pairs_joined(word_tokenizer, name):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args(name))
    system, tools, messages = messages_of("system_multi")
    turns = spec_ids(word_tokenizer, SPECS[name]["system_multi"])
    prompt, answer = template.encode_oneturn(word_tokenizer, messages, system, tools)
    assert prompt == turns[0][0] + turns[0][1] + turns[1][0]
    assert answer == turns[1][1]


def test_message_text_is_inserted_verbatim(word_tokenizer):
    # LLaMA-Factory 0.9.5 also replaces "{{idx}}" inside a user message with the turn number; lathe does not
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("default"))
    messages = [{"role": "user", "content": "{{idx}} {{content}}"}, {"role": "assistant", "content": "hi"}]
    prompt, _ = template.encode_oneturn(word_tokenizer, messages)
    content = ["{", "{", "<unk>", "}", "}", "{", "{", "content", "}", "}"]  # idx is not in the vocabulary
    assert word_tokenizer.convert_ids_to_tokens(prompt) == ["Human", ":"] + content + ["</s>", "\n", "Assistant", ":"]


def test_tool_descriptions_are_written_out_exactly():
    for tool_format, text in TOOL_TEXT.items():
        assert tool_registry.describe_tools(tool_format, TOOLS) == text, tool_format
    assert tool_registry.describe_tools("qwen", "[]") == ""
    # an OpenAI-style {"type": "function", "function": ...} entry describes the same tool
    wrapped = json.dumps([{"type": "function", "function": ADD_TOOL}])
    assert all(tool_registry.describe_tools(f, wrapped) == TOOL_TEXT[f] for f in TOOL_TEXT)


@pytest.mark.parametrize(
    "tool_format,expected",
    [
        ("default", 'Action: add\nAction Input: {"a": 2, "b": 2}'),
        ("qwen", '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call>'),
        ("llama3", '{"name": "add", "parameters": {"a": 2, "b": 2}}'),
        ("mistral", '[{"name": "add", "arguments": {"a": 2, "b": 2}}]'),
    ],
)
def test_function_calls_round_trip(tool_format, expected):
    text = tool_registry.format_function_message(CALL, tool_format)
    assert text == expected
    assert tool_registry.get_tool_format(tool_format).extract_calls(text) == [("add", '{"a": 2, "b": 2}')]
    assert tool_registry.get_tool_format(tool_format).extract_calls("just text") == "just text"


def test_function_message_keeps_thought_and_text_around_a_tool_call_block():
    words = (("<think>\n", "\n</think>\n\n"), ("<tool_call>", "</tool_call>"))
    thought = tool_registry.format_function_message(f"<think>\nhm\n</think>\n\n{CALL}", "default", *words)
    assert thought == '<think>\nhm\n</think>\n\nAction: add\nAction Input: {"a": 2, "b": 2}'
    wrapped = tool_registry.format_function_message(f"sure <tool_call>{CALL}</tool_call>", "default", *words)
    assert wrapped == 'sure Action: add\nAction Input: {"a": 2, "b": 2}'
    parallel = tool_registry.format_function_message(f"[{CALL}, {CALL}]", "qwen")
    assert parallel.count("<tool_call>") == 2
    for bad in ("{not json", '{"name": "add"}', "[1]"):
        with pytest.raises(InvalidMessage):
            tool_registry.format_function_message(bad, "default")
    with pytest.raises(InvalidMessage, match="tools are not valid JSON"):
        tool_registry.describe_tools("default", "[{")


@pytest.mark.parametrize(
    "name,eos,stops",
    [
        ("default", "</s>", ["</s>"]),
        ("chatml", "<|im_end|>", ["<|im_end|>", "<|im_start|>"]),
        ("qwen", "<|im_end|>", ["<|im_end|>"]),
        ("llama3", "<|eot_id|>", ["<|eot_id|>", "<|eom_id|>"]),
        ("mistral", "</s>", ["</s>"]),
    ],
)
def test_fix_special_tokens_sets_eos_pad_and_stop_words(word_tokenizer, name, eos, stops):
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args(name))
    assert word_tokenizer.eos_token == eos
    assert word_tokenizer.pad_token == eos  # the tokenizer had no PAD: it becomes the (new) EOS
    assert template.get_stop_token_ids(word_tokenizer) == word_tokenizer.convert_tokens_to_ids(stops)
    assert set(stops[1:]) <= set(word_tokenizer.all_special_tokens)  # the other stop words are special


def test_missing_eos_becomes_endoftext_and_new_stop_words_are_added(word_tokenizer):
    word_tokenizer.eos_token = None
    size = len(word_tokenizer)
    get_template_and_fix_tokenizer(word_tokenizer, data_args("default"))
    assert word_tokenizer.eos_token == "<|endoftext|>" and word_tokenizer.pad_token == "<|endoftext|>"
    custom = Template(name="custom", stop_words=("<|new_stop|>",))
    custom.fix_special_tokens(word_tokenizer)
    assert len(word_tokenizer) == size + 1 and "<|new_stop|>" in word_tokenizer.all_special_tokens
    assert word_tokenizer.eos_token == "<|endoftext|>"  # no replace_eos: only added as a stop word


def test_unknown_template_suggests_the_closest_names():
    with pytest.raises(ValueError) as error:
        get_template("chatm")
    assert str(error.value).startswith("Unknown template 'chatm': did you mean 'chatml'")
    assert set(BUILT_IN) <= set(template_names())


def test_overrides_apply_to_a_copy_not_the_registry(word_tokenizer):
    template = get_template_and_fix_tokenizer(
        word_tokenizer, data_args("qwen", default_system="be brief", tool_format="default")
    )
    assert template.default_system == "be brief" and template.tool_format == "default"
    assert TEMPLATES["qwen"].default_system.startswith("You are Qwen") and TEMPLATES["qwen"].tool_format == "qwen"
    with pytest.raises(ValueError, match="tool_format"):
        get_template_and_fix_tokenizer(word_tokenizer, data_args("qwen", tool_format="nope"))


def test_train_on_prompt_is_refused_for_efficient_eos_templates(word_tokenizer, monkeypatch):
    monkeypatch.setitem(TEMPLATES, "eff", Template(name="eff", efficient_eos=True, stop_words=("<|im_end|>",)))
    with pytest.raises(ValueError, match="train_on_prompt"):
        get_template_and_fix_tokenizer(word_tokenizer, data_args("eff", train_on_prompt=True))


def test_no_template_and_no_chat_template_means_empty(word_tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger="lathe.llm.templates"):
        template = get_template_and_fix_tokenizer(word_tokenizer, data_args(None))
    assert template.name == "empty" and "no chat_template" in caplog.text


def test_no_template_parses_the_tokenizers_chat_template(word_tokenizer, caplog):
    word_tokenizer.chat_template = (
        "{{ bos_token }}{% if messages[0]['role'] != 'system' %}{{ 'System : you are helpful ↵' }}{% endif %}"
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ 'System : ' + m['content'] + ' ↵' }}"
        "{% else %}{{ m['role'] + ' : ' + m['content'] + '</s>' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant : ' }}{% endif %}"
    ).replace("↵", "\n")
    with caplog.at_level(logging.WARNING, logger="lathe.llm.templates"):
        template = get_template_and_fix_tokenizer(word_tokenizer, data_args(None))
    assert "does not reproduce" not in caplog.text
    # LLaMA-Factory 0.9.5 reads the default system text here as "youare helpful " (a greedy character diff)
    assert template.default_system == "you are helpful"
    assert template.prefix == ()  # encode("") adds no BOS; the template's {{ bos_token }} opens the system slot
    assert template.system == ("<s>System : {{content}} \n",)
    assert template.user == ("user : {{content}}</s>assistant : ",)
    assert template.assistant == ("{{content}}</s>",)
    encoded = template.encode_multiturn(
        word_tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    )
    prompt = "<s> System : you are helpful \n user : hi </s> assistant :".split(" ")
    assert encoded == [
        (word_tokenizer.convert_tokens_to_ids(prompt), word_tokenizer.convert_tokens_to_ids(["hello", "</s>"]))
    ]


def test_a_chat_template_the_parser_gets_wrong_is_refused(word_tokenizer):
    # the answer of the last turn is rendered differently from earlier ones: slots cannot express that
    word_tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] + ' : ' + m['content'] }}{% if not loop.last %}{{ '</s>' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ 'assistant : ' }}{% endif %}"
    )
    with pytest.raises(ValueError, match="cannot find the assistant turns") as error:
        get_template_and_fix_tokenizer(word_tokenizer, data_args(None))
    assert "do not reproduce it" in str(error.value) and "Set `template`" in str(error.value)


def _jinja_conversations():
    system_multi = messages_of("system_multi")
    observation = (
        "be brief",
        "",
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "observation", "content": "4"},
            {"role": "assistant", "content": "four"},
        ],
    )
    no_system = ("", "", system_multi[2])
    return {
        "single": messages_of("single"),
        "system_multi": system_multi,
        "no_system": no_system,
        "observation": observation,
    }


@pytest.mark.parametrize("tokenizer_name", ["word", "bpe"])
@pytest.mark.parametrize("name", [n for n in BUILT_IN if n != "empty"] + ["llama2", "qwen3_nothink"])
def test_jinja_chat_template_renders_the_training_ids(tokenizer_name, name):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(GOLDEN_DIR / "tokenizers" / tokenizer_name))
    template = get_template_and_fix_tokenizer(tokenizer, data_args(name))
    assert tokenizer.chat_template == template.jinja_chat_template(tokenizer)  # it had none: written in
    for conversation, (system, _, messages) in _jinja_conversations().items():
        expected = [
            token for pair in template.encode_multiturn(tokenizer, messages, system) for ids in pair for token in ids
        ]
        chat = ([{"role": "system", "content": system}] if system else []) + [
            {**m, "role": "tool" if m["role"] == "observation" else m["role"]} for m in messages
        ]
        rendered = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)
        assert rendered == expected, (name, conversation)
        # the prompt for generation ends where the answer starts (the user slots open the answer)
        prompt = tokenizer.apply_chat_template(chat[:-1], tokenize=True, return_dict=False, add_generation_prompt=True)
        assert prompt == expected[: len(prompt)] and len(expected) - len(prompt) == len(
            template.encode_multiturn(tokenizer, messages, system)[-1][1]
        )


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_jinja_chat_template_of_a_reasoning_template_renders_history_as_llamafactory(word_tokenizer, enable_thinking):
    """The serving template renders what LLaMA-Factory's chat engine generates from (encode_oneturn): history
    answers without their thoughts and without an empty thought; the last answer with the empty thought
    it was trained with; with thinking disabled the generation prompt ends with the empty thought."""
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("qwen3", enable_thinking=enable_thinking))
    thought = {"role": "assistant", "content": "<think>\nok\n</think>\n\nhello"}
    messages = [
        {"role": "user", "content": "hi"},
        thought,
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "four"},
    ]
    prompt, answer = template.encode_oneturn(word_tokenizer, messages)
    assert word_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False) == prompt + answer
    generation = word_tokenizer.apply_chat_template(
        messages[:-1], tokenize=True, return_dict=False, add_generation_prompt=True
    )
    assert (
        generation == template.encode_oneturn(word_tokenizer, messages[:-1] + [{"role": "assistant", "content": ""}])[0]
    )
    text = word_tokenizer.apply_chat_template(messages, tokenize=False)
    history, last = text.split("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")[1:]
    assert history.startswith("hello<|im_end|>")  # no thought, no empty thought before an earlier answer
    assert last == "<think>\n\n</think>\n\nfour<|im_end|>\n"
    # the render argument overrides the template's setting, as with Qwen's own chat_template
    flipped = word_tokenizer.apply_chat_template(
        messages[:-1], tokenize=False, add_generation_prompt=True, enable_thinking=not enable_thinking
    )
    assert flipped.endswith("<think>\n\n</think>\n\n") == enable_thinking


def test_jinja_for_empty_gives_the_same_text(word_tokenizer):
    # `empty` puts nothing between messages, so a word tokenizer merges across them: text is what can match
    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("empty"))
    system, _, messages = messages_of("system_multi")
    text = word_tokenizer.apply_chat_template([{"role": "system", "content": system}] + messages, tokenize=False)
    assert text == "be brief" + "hi" + "hello" + "two plus two ?" + "four"
    assert template.name == "empty"


def test_jinja_refuses_tools_and_unknown_roles(word_tokenizer):
    # llama3's tool format is not written as Jinja (default, qwen and ling are: tests/llm/test_first_day.py)
    get_template_and_fix_tokenizer(word_tokenizer, data_args("llama3"))
    with pytest.raises(Exception, match="does not render tools"):
        word_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[ADD_TOOL], tokenize=False)
    with pytest.raises(Exception, match="Unsupported role"):
        word_tokenizer.apply_chat_template([{"role": "critic", "content": "hi"}], tokenize=False)


def test_jinja_literals_survive_quotes_backslashes_and_newlines(word_tokenizer):
    template = Template(
        name="odd", user=("it's \\ {{content}}\r\n",), default_system='say "hi"\t\'', system=("{{content}}|",)
    )
    word_tokenizer.chat_template = template.jinja_chat_template(word_tokenizer)
    text = word_tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert text == "say \"hi\"\t'|it's \\ x\r\n"


def test_a_tokenizers_own_chat_template_is_kept_unless_the_template_replaces_it(word_tokenizer):
    own = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    word_tokenizer.chat_template = own
    get_template_and_fix_tokenizer(word_tokenizer, data_args("qwen"))  # qwen: replace_jinja_template False
    assert word_tokenizer.chat_template == own
    get_template_and_fix_tokenizer(word_tokenizer, data_args("chatml"))  # chatml: True
    assert word_tokenizer.chat_template != own


def test_templates_and_tokenizer_fixes_equal_llamafactory(monkeypatch):
    """Every golden case: the tokenizer after the fix (EOS, PAD, size, stop ids), encode_oneturn and the
    text LLaMA-Factory's own chat_template renders, for templates x conversations x arguments."""
    from transformers import AutoTokenizer

    monkeypatch.setitem(TEMPLATES, GOLDEN_EFFICIENT_EOS.name, GOLDEN_EFFICIENT_EOS)
    golden = json.loads(gzip.decompress((GOLDEN_DIR / "llamafactory_golden.json.gz").read_bytes()))
    assert golden["meta"]["llamafactory"] == "0.9.5"
    conversations, probe = golden["meta"]["conversations"], golden["meta"]["probe"]
    checked = 0
    for case in golden["cases"]:
        expected = case["llamafactory"]
        if "tokenizer" not in expected:
            continue
        tokenizer = AutoTokenizer.from_pretrained(str(GOLDEN_DIR / "tokenizers" / case["tokenizer"]))
        template = get_template_and_fix_tokenizer(tokenizer, SimpleNamespace(template=case["template"], **case["args"]))
        where = (case["id"], case["tokenizer"], case["template"], case["conversation"])
        assert {
            "eos_token": tokenizer.eos_token,
            "pad_token": tokenizer.pad_token,
            "size": len(tokenizer),
            "stop_token_ids": sorted(template.get_stop_token_ids(tokenizer)),
            "efficient_eos": template.efficient_eos,
        } == expected["tokenizer"], where
        example = conversations[case["conversation"]]
        messages = example["_prompt"] + example["_response"]
        if "oneturn" in expected:
            prompt, answer = template.encode_oneturn(tokenizer, messages, example["_system"], example["_tools"])
            assert [prompt, answer] == expected["oneturn"], where
        elif "oneturn_error" in expected:
            with pytest.raises(InvalidMessage):
                template.encode_oneturn(tokenizer, messages, example["_system"], example["_tools"])
        # LLaMA-Factory's export leaves out the empty thought its reasoning templates train with; ours
        # renders it (test_jinja_chat_template_of_a_reasoning_template_adds_the_empty_thought)
        if "chat_template_text" in expected and not template.reasoning:
            assert tokenizer.apply_chat_template(probe, tokenize=False) == expected["chat_template_text"], where
        checked += 1
    assert checked > 400


def test_template_report_names_stop_tokens_and_flags_a_disagreeing_chat_template(word_tokenizer, caplog):
    from lathe.llm.templates.check import template_report
    from lathe.llm.templates.resolve import forget_chat_template_warnings

    template = get_template_and_fix_tokenizer(word_tokenizer, data_args("chatml"))
    report = template_report(template, word_tokenizer)
    im_end, im_start = word_tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|im_start|>"])
    assert (
        f"stop tokens (generation_config eos_token_id): '<|im_end|>' ({im_end}), '<|im_start|>' ({im_start})" in report
    )
    assert "renders the probe conversations exactly" in report and "WARNING" not in report
    # a model whose own chat_template (kept, as LLaMA-Factory keeps it, and saved) renders something else
    word_tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    forget_chat_template_warnings()  # a new run (an earlier test may have warned about the same pair)
    with caplog.at_level(logging.WARNING, logger="lathe.llm.templates"):
        template = get_template_and_fix_tokenizer(word_tokenizer, data_args("qwen"))
    assert "renders conversations differently from template 'qwen'" in caplog.text
    report = template_report(template, word_tokenizer)
    assert (
        "WARNING: the chat_template saved with the model disagrees with the training template on 4 probe(s)" in report
    )
    assert "generation prompt of" in report and "'<|im_start|>system" in report
