"""Regenerate the LLaMA-Factory golden file that tests/llm compare lathe against, token for token.

    python tests/llm/golden/make_llamafactory_golden.py [--python bench/.venv-lf/bin/python]

Run with lathe's Python from the repository root. It saves the test tokenizers under
tests/llm/golden/tokenizers/ (committed, so the tests never depend on BPE training being reproducible),
writes the cases (conversation + data arguments), then runs this same file in LLaMA-Factory's own
environment (`--worker`, where lathe is not imported) to encode every case with LLaMA-Factory's
`get_template_and_fix_tokenizer` and `SupervisedDatasetProcessor`, and writes
tests/llm/golden/llamafactory_golden.json.gz with the versions that produced it.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZERS = HERE / "tokenizers"
GOLDEN = HERE / "llamafactory_golden.json.gz"  # gzip: ~600 kB of JSON, 21 kB compressed
LLAMA3_TOOL_DATE = (2024, 7, 26)  # llama3's tool prompt states today's date: pinned on both sides

# ---- conversations (canonical columns: _prompt, _response, _system, _tools) ----------------------------
TOOLS = json.dumps(
    [
        {
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
    ]
)
CALL = '{"name": "add", "arguments": {"a": 2, "b": 2}}'


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def example(messages, system="", tools=""):
    return {"_prompt": messages[:-1], "_response": messages[-1:], "_system": system, "_tools": tools}


CONVERSATIONS = {
    "single": example([user("what is two plus two ?"), assistant("four .")]),
    "system": example([user("what is two plus two ?"), assistant("four .")], system="be brief ."),
    "multi": example(
        [user("hi"), assistant("hello"), user("what is two plus two ?"), assistant("four")], system="be brief ."
    ),
    "three_turns": example(
        [
            user("hi"),
            assistant("hello hello hello"),
            user("two plus two ?"),
            assistant("four"),
            user("add two and four"),
            assistant("the sum is 6 ."),
        ]
    ),
    "tools": example(
        [
            user("what is two plus two ?"),
            {"role": "function", "content": CALL},
            {"role": "observation", "content": '{"result": 4}'},
            assistant("four ."),
        ],
        tools=TOOLS,
    ),
    "tools_system": example(
        [
            user("add 2 and 2"),
            {"role": "function", "content": CALL},
            {"role": "observation", "content": "4"},
            assistant("4"),
        ],
        system="be brief .",
        tools=TOOLS,
    ),
    "parallel_calls": example(
        [
            user("add twice"),
            {"role": "function", "content": f"[{CALL}, {CALL}]"},
            {"role": "observation", "content": "4"},
            assistant("4 and 4"),
        ],
        tools=TOOLS,
    ),
    "wrapped_call": example(
        [
            user("add 2 and 2"),
            {"role": "function", "content": f"ok <tool_call>{CALL}</tool_call>"},
            {"role": "observation", "content": "4"},
            assistant("4"),
        ],
        tools=TOOLS,
    ),
    "thought_call": example(
        [
            user("add 2 and 2"),
            {"role": "function", "content": f"<think>\nthinking\n</think>\n\n{CALL}"},
            {"role": "observation", "content": "4"},
            assistant("4"),
        ],
        tools=TOOLS,
    ),
    "function_answer": example([user("add 2 and 2"), {"role": "function", "content": CALL}], tools=TOOLS),
    "empty_tools": example([user("hi"), assistant("hello")], tools="[]"),
    "empty_answer": example([user("hi"), assistant("")]),
    "bad_call_json": example(
        [
            user("hi"),
            {"role": "function", "content": "{not json"},
            {"role": "observation", "content": "4"},
            assistant("4"),
        ]
    ),
    "thoughts": example(
        [
            user("hi"),
            assistant("<think>\nthinking\n</think>\n\nhello"),
            user("two plus two ?"),
            assistant("<think>\nok\n</think>\n\nfour"),
        ],
        system="be brief .",
    ),
    "thoughts_partial": example(
        [user("hi"), assistant("hello"), user("two plus two ?"), assistant("<think>\nok\n</think>\n\nfour")]
    ),
}

NAMED = ["default", "empty", "alpaca", "chatml", "qwen", "llama3", "mistral", "llama2", "qwen3_nothink"]
# None of the built-in names uses efficient_eos: this one is registered on both sides (LLaMA-Factory below,
# lathe in tests/llm/test_supervised.py) with the same slots.
EFFICIENT_EOS = "test_efficient_eos"
BASE = {
    "cutoff_len": 1024,
    "train_on_prompt": False,
    "mask_history": False,
    "tool_format": None,
    "default_system": None,
    "enable_thinking": True,
    "preserve_thinking": False,
}


def build_cases() -> list[dict]:
    cases = []

    def add(tokenizer, template, conversation, **args):
        cases.append(
            {"tokenizer": tokenizer, "template": template, "conversation": conversation, "args": {**BASE, **args}}
        )

    general = [
        "single",
        "system",
        "multi",
        "three_turns",
        "tools",
        "tools_system",
        "parallel_calls",
        "wrapped_call",
        "thought_call",
        "function_answer",
        "empty_tools",
        "empty_answer",
        "bad_call_json",
    ]
    for template in NAMED + [EFFICIENT_EOS]:  # the word tokenizer: every case
        for conversation in general:
            add("word", template, conversation)
        add("word", template, "multi", train_on_prompt=True)
        add("word", template, "three_turns", mask_history=True)
        add("word", template, "tools", mask_history=True)
        add("word", template, "single", default_system="you are helpful")
        for cutoff_len in (4, 9, 16, 23, 40):
            add("word", template, "three_turns", cutoff_len=cutoff_len)
            add("word", template, "three_turns", cutoff_len=cutoff_len, mask_history=True)
            add("word", template, "system", cutoff_len=cutoff_len)
    for template in NAMED:  # byte-level BPE (real merges, spaces kept): a smaller set, tool prompts are long
        for conversation in ("single", "system", "multi", "three_turns", "tools", "empty_answer"):
            add("bpe", template, conversation)
        add("bpe", template, "multi", train_on_prompt=True)
        add("bpe", template, "three_turns", mask_history=True)
        add("bpe", template, "three_turns", cutoff_len=23, mask_history=True)
        add("bpe", template, "system", cutoff_len=16)
    for tool_format in ("qwen", "default", "llama3", "mistral"):  # tool_format overrides the template's
        add("word", "chatml", "tools", tool_format=tool_format)
    add("word", "qwen", "tools", tool_format="default")
    for tokenizer in ("word", "bpe"):  # the reasoning template
        for conversation in ("single", "multi", "thoughts", "thoughts_partial", "tools"):
            add(tokenizer, "qwen3", conversation)
            add(tokenizer, "qwen3", conversation, enable_thinking=False)
            add(tokenizer, "qwen3", conversation, mask_history=True)
            add(tokenizer, "qwen3", conversation, preserve_thinking=True, mask_history=True)
    for tokenizer in ("bpe_chatml", "bpe_header"):  # template=None: parsed from the tokenizer's chat_template
        for conversation in ("single", "system", "multi", "three_turns"):
            add(tokenizer, None, conversation)
        add(tokenizer, None, "three_turns", cutoff_len=16, mask_history=True)
    for index, case in enumerate(cases):
        case["id"] = index
    return cases


# ---- tokenizers (built with lathe's environment, saved, committed) --------------------------------------
BPE_CORPUS = [
    "Human: what is two plus two? Assistant: four. System: be brief.",
    "### Instruction:\nadd two and four\n\n### Response:\nthe sum is 6.",
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    'user assistant system tool ipython {"name": "add", "arguments": {"a": 2, "b": 2}} {"result": 4}',
    "You have access to the following tools: Tool Name Tool Description Tool Args Action Input",
]
CHATML_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = 'You are a helpful assistant.' %}{% set rest = messages %}{% endif %}"
    "{{ '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}"
    "{% for m in rest %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
HEADER_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def save_tokenizers() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.llm.conftest import WORD_SPECIAL_TOKENS, build_word_tokenizer

    build_word_tokenizer().save_pretrained(TOKENIZERS / "word")
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=WORD_SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(BPE_CORPUS * 4, trainer=trainer)
    backend.add_tokens(
        [
            AddedToken(word, normalized=False)
            for word in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
        ]
    )

    def fast(**kwargs):
        return PreTrainedTokenizerFast(
            tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", **kwargs
        )

    fast().save_pretrained(TOKENIZERS / "bpe")
    fast(chat_template=CHATML_TEMPLATE).save_pretrained(TOKENIZERS / "bpe_chatml")
    # encode("") gives [<s>]: exercises the prefix found when parsing a chat_template
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast(chat_template=HEADER_TEMPLATE).save_pretrained(TOKENIZERS / "bpe_header")


# ---- the LLaMA-Factory side (runs in its environment) ----------------------------------------------------
PROBE = [
    {"role": "system", "content": "be brief ."},
    user("hi"),
    assistant("hello"),
    user("two plus two ?"),
    assistant("four"),
]


def run_llamafactory(cases: list[dict]) -> dict:
    import datetime as real_datetime

    import llamafactory
    import transformers
    from llamafactory.data import template as lf_template
    from llamafactory.data import tool_utils
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.processor.unsupervised import UnsupervisedDatasetProcessor
    from llamafactory.hparams import DataArguments
    from transformers import AutoTokenizer

    class PinnedDatetime(real_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(*LLAMA3_TOOL_DATE)

    tool_utils.datetime = PinnedDatetime
    # LLaMA-Factory edits its registered templates in place (tool_format, default_system): start each case
    # from a pristine copy.
    from llamafactory.data.formatter import StringFormatter

    lf_template.register_template(
        name=EFFICIENT_EOS,
        format_user=StringFormatter(slots=["<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n"]),
        format_system=StringFormatter(slots=["<|im_start|>system\n{{content}}<|im_end|>\n"]),
        format_observation=StringFormatter(slots=["<|im_start|>tool\n{{content}}<|im_end|>\n<|im_start|>assistant\n"]),
        stop_words=["<|endoftext|>"],
        efficient_eos=True,
    )
    pristine = copy.deepcopy(lf_template.TEMPLATES)
    results = []
    for case in cases:
        lf_template.TEMPLATES.clear()
        lf_template.TEMPLATES.update(copy.deepcopy(pristine))
        tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZERS / case["tokenizer"]))
        result = {"id": case["id"]}
        try:
            data_args = DataArguments(template=case["template"], **case["args"])
            template = lf_template.get_template_and_fix_tokenizer(tokenizer, data_args)
            result["tokenizer"] = {
                "eos_token": tokenizer.eos_token,
                "pad_token": tokenizer.pad_token,
                "size": len(tokenizer),
                "stop_token_ids": sorted(template.get_stop_token_ids(tokenizer)),
                "efficient_eos": template.efficient_eos,
            }
            if isinstance(tokenizer.chat_template, str) and case["conversation"] == "single" and case["args"] == BASE:
                result["chat_template_text"] = tokenizer.apply_chat_template(PROBE, tokenize=False)
            ex = CONVERSATIONS[case["conversation"]]
            try:
                prompt_ids, response_ids = template.encode_oneturn(
                    tokenizer, ex["_prompt"] + ex["_response"], ex["_system"], ex["_tools"]
                )
                if case["args"] == BASE:  # flags do not change encode_oneturn
                    result["oneturn"] = [prompt_ids, response_ids]
            except Exception as error:  # recorded: lathe must refuse the same example
                result["oneturn_error"] = f"{type(error).__name__}: {error}"
            processor = SupervisedDatasetProcessor(
                template=template, tokenizer=tokenizer, processor=None, data_args=data_args
            )
            batch = {key: [value] for key, value in ex.items()}
            batch.update(_images=[None], _videos=[None], _audios=[None])
            out = processor.preprocess_dataset(batch)
            if out["input_ids"]:
                result["input_ids"], result["labels"] = out["input_ids"][0], out["labels"][0]
            else:
                result["dropped"] = True
            # prompt-only rows for predict_with_generate
            processor = UnsupervisedDatasetProcessor(
                template=template, tokenizer=tokenizer, processor=None, data_args=data_args
            )
            out = processor.preprocess_dataset(batch)
            result["unsupervised"] = [out["input_ids"][0], out["labels"][0]]
        except Exception as error:
            result["error"] = f"{type(error).__name__}: {error}"
        results.append(result)
    return {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(HERE.parents[2] / "bench/.venv-lf/bin/python"))
    parser.add_argument("--worker", nargs=2, metavar=("CASES", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        cases = json.loads(Path(args.worker[0]).read_text())
        Path(args.worker[1]).write_text(json.dumps(run_llamafactory(cases)))
        return

    save_tokenizers()
    cases = build_cases()
    with tempfile.TemporaryDirectory() as folder:
        cases_file, out_file = Path(folder, "cases.json"), Path(folder, "out.json")
        cases_file.write_text(json.dumps(cases))
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            PYTHONPATH=str(HERE.parents[2] / "bench/lf_stubs"),
            LLAMAFACTORY_VERBOSITY="ERROR",
        )
        subprocess.run(
            [args.python, __file__, "--worker", str(cases_file), str(out_file)], check=True, env=env, cwd=folder
        )
        produced = json.loads(out_file.read_text())
    results = {result["id"]: result for result in produced.pop("results")}
    lines = [json.dumps({**case, "llamafactory": results[case["id"]]}, ensure_ascii=False) for case in cases]
    header = json.dumps(
        {**produced, "llama3_tool_date": LLAMA3_TOOL_DATE, "probe": PROBE, "conversations": CONVERSATIONS},
        ensure_ascii=False,
    )
    text = '{"meta": ' + header + ',\n"cases": [\n' + ",\n".join(lines) + "\n]}\n"
    GOLDEN.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    print(f"wrote {len(cases)} cases to {GOLDEN} (LLaMA-Factory {produced['llamafactory']})")


if __name__ == "__main__":
    main()
