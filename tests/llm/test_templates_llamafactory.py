"""Every chat template of LLaMA-Factory 0.9.5, token for token (golden file made by
tests/llm/golden/make_llamafactory_templates.py): for each of the 121 templates, single-turn, system,
multi-turn, train_on_prompt, mask_history (with truncation), default_system, tool-calling (with the
template's tool format, an explicit tool_format, and parallel calls) and, for reasoning templates,
thoughts with enable_thinking / preserve_thinking, on a tokenizer that has the templates' special tokens:
the tokenizer after the fix, the supervised (input_ids, labels), and the prompt generation starts from,
both through lathe's chat engine encoding and through the chat_template lathe saves with the model."""

import gzip
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from lathe.llm.data.supervised import preprocess_supervised_dataset  # noqa: E402
from lathe.llm.templates import (  # noqa: E402
    TEMPLATES,
    get_template_and_fix_tokenizer,
    template_names,
    tool_calls,  # noqa: E402
)
from lathe.llm.templates.tools import TOOL_FORMATS, describe_tools, format_function_message  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"
# Where LLaMA-Factory's reader cannot read back what its own writer wrote for a format, lathe reads the calls
# (test_reading_calls_back_inverts_writing_them); nothing else differs.
READS_BACK_WHERE_LLAMAFACTORY_DOES_NOT = {"glm4_moe", "minimax2"}


@pytest.fixture(scope="module")
def golden():
    return json.loads(gzip.decompress((GOLDEN_DIR / "llamafactory_templates.json.gz").read_bytes()))


@pytest.fixture(autouse=True)
def pinned_date(monkeypatch, golden):
    year, month, day = golden["meta"]["tool_date"]
    import datetime

    monkeypatch.setattr(tool_calls, "today", lambda: datetime.date(year, month, day).strftime("%d %b %Y"))


def test_every_llamafactory_template_is_here(golden):
    meta = golden["meta"]
    assert meta["llamafactory"] == "0.9.5" and len(meta["templates"]) == 121
    assert set(meta["templates"]) <= set(template_names())
    # the 48 templates LLaMA-Factory pairs with a multimodal plugin: their plugin passes text rows through
    # untouched, so text rows equal a plain template's; lathe records the plugin and refuses media
    multimodal = {name for name in meta["templates"] if TEMPLATES[name].multimodal}
    assert multimodal == set(meta["plugins_leave_text_unchanged"]) and len(multimodal) == 48
    assert all(meta["plugins_leave_text_unchanged"].values())


def _chat(example) -> list[dict]:
    system = [{"role": "system", "content": example["_system"]}] if example["_system"] else []
    return system + [{**m, "role": "tool" if m["role"] == "observation" else m["role"]} for m in example["_prompt"]]


def _check_case(case, tokenizer, outcomes) -> None:
    expected, example = case["llamafactory"], case["example"]
    args = SimpleNamespace(template=case["template"], **case["args"])
    where = (case["id"], case["template"], case["conversation"], case["args"])
    if "error" in expected:  # a configuration LLaMA-Factory refuses (train_on_prompt with efficient_eos)
        with pytest.raises(ValueError, match="train_on_prompt"):
            get_template_and_fix_tokenizer(tokenizer, args)
        outcomes["refused"] += 1
        return
    template = get_template_and_fix_tokenizer(tokenizer, args)
    state = {
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "size": len(tokenizer),
        "stop_token_ids": sorted(template.get_stop_token_ids(tokenizer)),
    }
    assert state == expected["tokenizer"], where
    skipped = Counter()
    out = preprocess_supervised_dataset(
        {key: [value] for key, value in example.items()}, template, tokenizer, args, skipped=skipped
    )
    if "encode_error" in expected:  # LLaMA-Factory aborts the run; lathe skips the row and says why
        assert not out["input_ids"] and "parallel" in next(iter(skipped)), where
        outcomes["skipped"] += 1
    else:  # rows left with no trained token included: kept, as LLaMA-Factory keeps them
        assert (out["input_ids"], out["labels"]) == ([expected["input_ids"]], [expected["labels"]]), where
        outcomes["rows equal"] += 1
    if "inference_prompt" in expected:
        messages = example["_prompt"] + [{"role": "assistant", "content": ""}]
        prompt, _ = template.encode_oneturn(tokenizer, messages, example["_system"], example["_tools"])
        assert prompt == expected["inference_prompt"], where
        outcomes["inference prompts equal"] += 1
        if not example["_tools"]:  # the saved chat_template renders the same prompt
            chat = _chat(example)
            rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            assert rendered == tokenizer.decode(expected["inference_prompt"]), where
            outcomes["chat_template texts equal"] += 1
            if tokenizer(rendered, add_special_tokens=False)["input_ids"] != expected["inference_prompt"]:
                outcomes.setdefault("retokenized differently", set()).add(case["template"])


def test_every_template_encodes_as_llamafactory(golden):
    from transformers import AutoTokenizer

    original = AutoTokenizer.from_pretrained(str(GOLDEN_DIR / "tokenizers" / "bpe_special"))
    outcomes, tokenizers = Counter(), {}
    for case in golden["cases"]:
        # the fixes are idempotent, so one tokenizer per template serves all its cases (the state is checked)
        if case["template"] not in tokenizers:
            tokenizers = {case["template"]: _copy(original)}
        _check_case(case, tokenizers[case["template"]], outcomes)
    assert outcomes["rows equal"] > 1400 and outcomes["refused"] == 20 and outcomes["skipped"] == 5, outcomes
    assert outcomes["inference prompts equal"] == 121 * 2 + 25 and outcomes["chat_template texts equal"] == 121 + 25
    # A chat_template is text: a server tokenizes it as one string. Where a template's slot ends in plain text
    # that the content continues ("[/INST] " + "hello"), byte-level BPE merges across the boundary; lathe's own
    # chat engine encodes slot by slot, as training does. Only these two templates meet this on this tokenizer.
    assert outcomes["retokenized differently"] == {"breeze", "ernie_nothink"}


def _copy(tokenizer):
    import copy

    return copy.deepcopy(tokenizer)


def _calls(extracted):
    return [list(call) for call in extracted] if isinstance(extracted, list) else extracted


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_tool_formats_write_what_llamafactory_writes(golden, name):
    expected = golden["meta"]["tool_formats"][name]
    tools = json.dumps(golden["meta"]["tools"])
    assert describe_tools(name, tools) == expected["describe"]
    for key, calls in (("single", golden["meta"]["calls"][:1]), ("parallel", golden["meta"]["calls"])):
        content = json.dumps(calls if key == "parallel" else calls[0])
        if "error" in expected[key]:
            with pytest.raises(ValueError, match="parallel"):
                format_function_message(content, name)
            continue
        text = format_function_message(content, name)
        assert text == expected[key]["text"]
        extracted = _calls(TOOL_FORMATS[name].extract_calls(text))
        if name in READS_BACK_WHERE_LLAMAFACTORY_DOES_NOT:
            assert expected[key]["extracted"] == text
        else:
            assert extracted == expected[key]["extracted"]
    assert TOOL_FORMATS[name].extract_calls("just text") == expected["plain"]


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_reading_calls_back_inverts_writing_them(golden, name):
    calls = golden["meta"]["calls"]
    if name == "glm4":
        calls = calls[:1]  # one call per answer
    text = format_function_message(json.dumps(calls), name)
    extracted = TOOL_FORMATS[name].extract_calls(text)
    assert [(call.name, json.loads(call.arguments)) for call in extracted] == [
        (call["name"], call["arguments"]) for call in calls
    ]
