"""Regenerate the golden file that proves every LLaMA-Factory 0.9.5 chat template equal in lathe, token for token.

    python tests/llm/golden/make_llamafactory_templates.py [--python bench/.venv-lf/bin/python]

Run with lathe's Python from the repository root. It saves the test tokenizer tests/llm/golden/tokenizers/
bpe_special (a byte-level BPE that has every role marker, stop word and thought word of the templates as a
special token, as the models' own tokenizers do), writes the cases (template x conversation x data
arguments), then runs this same file in LLaMA-Factory's environment (`--worker`, where lathe is not
imported) and writes tests/llm/golden/llamafactory_templates.json.gz with, per case, LLaMA-Factory's
tokenizer after get_template_and_fix_tokenizer, the supervised (input_ids, labels) and the prompt its chat
engine generates from (encode_oneturn with an empty assistant turn); and, per tool format, the tool
description, the written calls and the calls read back.

Templates that LLaMA-Factory pairs with a multimodal plugin are encoded with the plugin its text rows go
through; the worker first checks, with a stand-in processor, that every such plugin leaves text-only
messages and ids unchanged (recorded in the meta data), which is why their text rows equal a plain template's.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER = HERE / "tokenizers" / "bpe_special"
GOLDEN = HERE / "llamafactory_templates.json.gz"
TOOL_DATE = (2024, 7, 26)  # llama3's tool prompt states today's date: pinned on both sides

TOOLS = [
    {
        "name": "add",
        "description": "add two numbers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "first number"},
                "b": {"type": "integer", "description": "second"},
            },
            "required": ["a", "b"],
        },
    },
    {
        "type": "function",
        "function": {
            "name": "tag",
            "description": "tag it",
            "parameters": {
                "type": "object",
                "properties": {
                    "labels": {"type": "array", "items": {"type": "string"}},
                    "mode": {"type": "string", "enum": ["fast", "slow"]},
                },
            },
        },
    },
]
CALL = {"name": "add", "arguments": {"a": 2, "b": 2}}
CALLS = [
    CALL,
    {
        "name": "tag",
        "arguments": {
            "labels": ["x", "y z"],
            "mode": "fast",
            "flag": True,
            "none": None,
            "ratio": 0.5,
            "nested": {"k": "v"},
        },
    },
]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def example(messages, system="", tools=""):
    return {"_prompt": messages[:-1], "_response": messages[-1:], "_system": system, "_tools": tools}


def conversations(thought_words) -> dict:
    def thought(text, answer):
        return thought_words[0] + text + thought_words[1] + answer

    tool_turns = [
        user("what is two plus two ?"),
        {"role": "function", "content": json.dumps(CALL)},
        {"role": "observation", "content": '{"result": 4}'},
        assistant("four ."),
    ]
    return {
        "single": example([user("what is two plus two ?"), assistant("four .")]),
        "system": example([user("what is two plus two ?"), assistant("four .")], system="be brief ."),
        "multi": example(
            [user("hi"), assistant("hello"), user("two plus two ?"), assistant("four")], system="be brief ."
        ),
        "three_turns": example(
            [
                user("hi"),
                assistant("hello hello"),
                user("two plus two ?"),
                assistant("four"),
                user("add two and four"),
                assistant("the sum is 6 ."),
            ]
        ),
        "tools": example(tool_turns, tools=json.dumps(TOOLS)),
        "tools_system": example(tool_turns, system="be brief .", tools=json.dumps(TOOLS)),
        "parallel": example(
            [
                user("add and tag"),
                {"role": "function", "content": json.dumps(CALLS)},
                {"role": "observation", "content": "done"},
                assistant("done ."),
            ],
            tools=json.dumps(TOOLS),
        ),
        "thoughts": example(
            [
                user("hi"),
                assistant(thought("greet", "hello")),
                user("two plus two ?"),
                assistant(thought("add", "four")),
            ],
            system="be brief .",
        ),
        "thoughts_partial": example(
            [user("hi"), assistant("hello"), user("two plus two ?"), assistant(thought("add", "four"))]
        ),
    }


BASE = {
    "cutoff_len": 1024,
    "train_on_prompt": False,
    "mask_history": False,
    "tool_format": None,
    "default_system": None,
    "enable_thinking": True,
    "preserve_thinking": False,
}
INFERENCE = ("multi", "tools_system", "thoughts")  # cases whose inference prompt is recorded too


def build_cases(templates: dict) -> list[dict]:
    cases = []

    def add(template, conversation, **args):
        cases.append(
            {
                "id": len(cases),
                "template": template,
                "conversation": conversation,
                "example": conversations(templates[template]["thought_words"])[conversation],
                "args": {**BASE, **args},
            }
        )

    for name, info in templates.items():
        for conversation in ("single", "system", "multi", "tools", "tools_system", "parallel"):
            add(name, conversation)
        add(name, "multi", train_on_prompt=True)
        add(name, "three_turns", mask_history=True)
        add(name, "three_turns", mask_history=True, cutoff_len=24)
        add(name, "single", default_system="you are helpful .")
        add(name, "tools", tool_format="default")
        if info["reasoning"]:
            add(name, "thoughts")
            add(name, "thoughts_partial")
            add(name, "thoughts", enable_thinking=False)
            add(name, "thoughts_partial", enable_thinking=False)
            add(name, "thoughts", mask_history=True)
            add(name, "thoughts", preserve_thinking=True, mask_history=True)
    return cases


# ---- the tokenizer (built with lathe's environment, saved, committed) ---------------------------------
CORPUS = [
    "Human: what is two plus two? Assistant: four. System: be brief. hello hi the sum is 6.",
    "You are a helpful assistant. Below is an instruction that describes a task.",
    'user assistant system tool model ipython {"name": "add", "arguments": {"a": 2, "b": 2}} {"result": 4}',
    "You have access to the following tools: Tool Name Tool Description Tool Args Action Input",
]
MARKER = re.compile(
    r"<\|[^<>|\n]*\|>|<｜[^｜\n]*｜>|\[/?[A-Z_]+\]|\[\|[a-z]+\|\]|<\|[a-z]+>|<[a-z]+\|>"
    r"|</?[a-z_:]+>|◁/?think▷|\[gMASK\]"
)
EXTRA = ["]~b]", "]~!b[", "[e~[", "sop", '<|"|>', "<|tool_call>", "<tool_call|>", "<|tool>", "<tool|>"]


def special_tokens(template_infos: dict) -> list[str]:
    texts = []
    for info in template_infos.values():
        texts += info["texts"]
    found = {match for text in texts for match in MARKER.findall(text)}
    found -= {"<s>", "</s>", "<unk>"}
    return sorted(found) + EXTRA


def lathe_templates() -> dict:
    sys.path.insert(0, str(HERE.parents[2]))
    from lathe.llm.templates import TEMPLATES

    infos = {}
    for name, template in TEMPLATES.items():
        slots = [
            *template.user,
            *template.assistant,
            *template.system,
            *template.observation,
            *template.function,
            *template.prefix,
        ]
        texts = [s if isinstance(s, str) else s.text for s in slots] + list(template.stop_words)
        texts += list(template.thought_words) + list(template.tool_call_words) + [template.raw_tools_slot or ""]
        infos[name] = {"thought_words": list(template.thought_words), "reasoning": template.reasoning, "texts": texts}
    return infos


def save_tokenizer(markers: list[str]) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(CORPUS * 4, trainer=trainer)
    backend.add_special_tokens([AddedToken(marker, normalized=False, special=True) for marker in markers])
    PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(TOKENIZER)


# ---- the LLaMA-Factory side (runs in its environment) -------------------------------------------------
class StandInProcessor:
    """Enough of a multimodal processor for a plugin to run on text-only rows (no image is ever processed)."""

    class Part:
        merge_size, merge_kernel_size, max_slice_nums, use_image_id = 2, (2, 2), 1, False

    image_processor = video_processor = feature_extractor = audio_processor = Part()
    image_seq_length, boi_token, eoi_token, full_image_sequence = 0, "<boi>", "<eoi>", "<img>"
    boa_token, eoa_token, full_audio_sequence, audio_bos_token, audio_eos_token = (
        "<boa>",
        "<eoa>",
        "<aud>",
        "<a>",
        "</a>",
    )
    image_token, video_token, audio_token = "<image>", "<video>", "<audio>"


def plugins_leave_text_unchanged(lf_template, tokenizer) -> dict:
    messages = [user("hi there"), assistant("hello")]
    result = {}
    for name, template in lf_template.TEMPLATES.items():
        plugin = template.mm_plugin
        if type(plugin).__name__ == "BasePlugin":
            continue
        out = plugin.process_messages(copy.deepcopy(messages), [], [], [], StandInProcessor())
        ids = plugin.process_token_ids([5, 6], [-100, 6], [], [], [], tokenizer, StandInProcessor())
        result[name] = out == messages and ids == ([5, 6], [-100, 6])
    return result


def tool_format_goldens() -> dict:
    from llamafactory.data.tool_utils import TOOLS as LF_TOOLS
    from llamafactory.data.tool_utils import FunctionCall

    goldens = {}
    for name, utils in LF_TOOLS.items():
        entry = {"describe": utils.tool_formatter(copy.deepcopy(TOOLS))}
        for key, calls in (("single", [CALL]), ("parallel", CALLS)):
            function_calls = [FunctionCall(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls]
            try:
                text = utils.function_formatter(function_calls)
                entry[key] = {"text": text, "extracted": utils.tool_extractor(text)}
            except Exception as error:  # recorded: lathe must refuse the same calls
                entry[key] = {"error": f"{type(error).__name__}: {error}"}
        entry["plain"] = utils.tool_extractor("just text")
        goldens[name] = entry
    return goldens


def run_case(case, lf_template, pristine, base_plugin, tokenizer_class, processors, DataArguments) -> dict:
    name = case["template"]
    lf_template.TEMPLATES[name] = copy.deepcopy(pristine[name])  # LLaMA-Factory edits templates in place
    tokenizer = tokenizer_class.from_pretrained(str(TOKENIZER))
    result = {}
    try:
        data_args = DataArguments(template=name, **case["args"])
        template = lf_template.get_template_and_fix_tokenizer(tokenizer, data_args)
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}
    template.mm_plugin = base_plugin  # text rows: checked to be unchanged by the template's own plugin
    result["tokenizer"] = {
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "size": len(tokenizer),
        "stop_token_ids": sorted(template.get_stop_token_ids(tokenizer)),
    }
    ex = case["example"]
    batch = {key: [value] for key, value in ex.items()}
    batch.update(_images=[None], _videos=[None], _audios=[None])
    supervised, unsupervised = processors
    try:
        out = supervised(
            template=template, tokenizer=tokenizer, processor=None, data_args=data_args
        ).preprocess_dataset(copy.deepcopy(batch))
        result["input_ids"], result["labels"] = out["input_ids"][0], out["labels"][0]
    except Exception as error:
        result["encode_error"] = f"{type(error).__name__}: {error}"
    if case["conversation"] in INFERENCE and case["args"] == BASE:
        messages = ex["_prompt"] + [{"role": "assistant", "content": ""}]
        try:
            result["inference_prompt"] = template.encode_oneturn(tokenizer, messages, ex["_system"], ex["_tools"])[0]
        except Exception as error:
            result["inference_error"] = f"{type(error).__name__}: {error}"
    return result


def run_llamafactory(cases: list[dict]) -> dict:
    import datetime as real_datetime

    import llamafactory
    import transformers
    from llamafactory.data import template as lf_template
    from llamafactory.data import tool_utils
    from llamafactory.data.mm_plugin import get_mm_plugin
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.processor.unsupervised import UnsupervisedDatasetProcessor
    from llamafactory.hparams import DataArguments
    from transformers import AutoTokenizer

    class PinnedDatetime(real_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(*TOOL_DATE)

    tool_utils.datetime = PinnedDatetime
    pristine = copy.deepcopy(lf_template.TEMPLATES)
    processors = (SupervisedDatasetProcessor, UnsupervisedDatasetProcessor)
    base_plugin = get_mm_plugin(name="base")
    plugins = plugins_leave_text_unchanged(lf_template, AutoTokenizer.from_pretrained(str(TOKENIZER)))
    results = {
        case["id"]: run_case(case, lf_template, pristine, base_plugin, AutoTokenizer, processors, DataArguments)
        for case in cases
    }
    return {
        "llamafactory": llamafactory.__version__,
        "transformers": transformers.__version__,
        "templates": sorted(pristine),
        "results": results,
        "tool_formats": tool_format_goldens(),
        "plugins_leave_text_unchanged": plugins,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(HERE.parents[2] / "bench/.venv-lf/bin/python"))
    parser.add_argument("--worker", nargs=2, metavar=("CASES", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        cases = json.loads(Path(args.worker[0]).read_text())
        Path(args.worker[1]).write_text(json.dumps(run_llamafactory(cases), ensure_ascii=False))
        return

    infos = lathe_templates()
    save_tokenizer(special_tokens(infos))
    cases = build_cases(infos)
    with tempfile.TemporaryDirectory() as folder:
        cases_file, out_file = Path(folder, "cases.json"), Path(folder, "out.json")
        cases_file.write_text(json.dumps(cases, ensure_ascii=False))
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            PYTHONPATH=str(Path(args.python).parents[2] / "lf_stubs"),  # bench/lf_stubs beside the venv
            LLAMAFACTORY_VERBOSITY="ERROR",
            OMP_NUM_THREADS="1",
        )
        subprocess.run(
            [args.python, __file__, "--worker", str(cases_file), str(out_file)], check=True, env=env, cwd=folder
        )
        produced = json.loads(out_file.read_text())
    results = produced.pop("results")
    lines = [json.dumps({**case, "llamafactory": results[str(case["id"])]}, ensure_ascii=False) for case in cases]
    header = json.dumps({**produced, "tool_date": TOOL_DATE, "tools": TOOLS, "calls": CALLS}, ensure_ascii=False)
    text = '{"meta": ' + header + ',\n"cases": [\n' + ",\n".join(lines) + "\n]}\n"
    GOLDEN.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    print(
        f"wrote {len(cases)} cases to {GOLDEN} ({GOLDEN.stat().st_size // 1024} kB, LLaMA-Factory "
        f"{produced['llamafactory']})"
    )


if __name__ == "__main__":
    main()
