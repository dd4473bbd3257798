"""Regenerate LLaMA-Factory's packed sft rows that tests/llm/test_packing.py compares lathe against.

    python tests/llm/golden/make_llamafactory_packing.py [--python bench/.venv-lf/bin/python]

Runs this same file in LLaMA-Factory's environment (`--worker`, where lathe is not imported): the
conversations below go through LLaMA-Factory 0.9.5's `PackedSupervisedDatasetProcessor` in one batch with
the qwen template and the committed BPE tokenizer (tests/llm/golden/tokenizers/bpe). Its DataArguments lower
cutoff_len by one when packing (201 -> 200) and pad every row to 201. Writes
tests/llm/golden/llamafactory_packing.json with the versions that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_packing.json"
TOKENIZER = HERE / "tokenizers" / "bpe"
WORDS = (
    "The quick brown fox jumps over the lazy dog . What is two plus two ? Two plus two is four . "
    "Reverse the string abc : cba . You are a helpful assistant ."
).split()
CUTOFF_LEN = 201  # LLaMA-Factory packs into 200 (cutoff_len - 1) and pads to 201
CASES = [
    {"neat_packing": False, "train_on_prompt": False},
    {"neat_packing": True, "train_on_prompt": False},
    {"neat_packing": False, "train_on_prompt": True},
]


def conversations(count: int = 30, seed: int = 7) -> list[dict]:
    """Single- and multi-turn conversations of a few words per message, some with a system prompt."""
    rng = random.Random(seed)

    def text():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))

    rows = []
    for _ in range(count):
        turns = rng.choice([1, 1, 2, 3])
        messages = []
        for _ in range(turns):
            messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        rows.append(
            {
                "_prompt": messages[:-1],
                "_response": messages[-1:],
                "_system": text() if rng.random() < 0.3 else "",
                "_tools": "",
            }
        )
    return rows


def run_llamafactory() -> dict:
    import llamafactory
    import transformers
    from llamafactory.data.processor.supervised import PackedSupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from transformers import AutoTokenizer

    rows = conversations()
    batch = {key: [row[key] for row in rows] for key in rows[0]}
    batch.update(_images=[None] * len(rows), _videos=[None] * len(rows), _audios=[None] * len(rows))
    results = []
    for case in CASES:
        tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
        data_args = DataArguments(template="qwen", cutoff_len=CUTOFF_LEN, packing=True, **case)
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        processor = PackedSupervisedDatasetProcessor(
            template=template, tokenizer=tokenizer, processor=None, data_args=data_args
        )
        out = processor.preprocess_dataset(batch)
        results.append(
            {
                **case,
                "packed_cutoff_len": data_args.cutoff_len,
                "pad_token_id": tokenizer.pad_token_id,
                **{key: out[key] for key in ("input_ids", "attention_mask", "position_ids", "labels")},
            }
        )
    return {
        "versions": {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__},
        "tokenizer": "bpe",
        "template": "qwen",
        "cutoff_len": CUTOFF_LEN,
        "conversations": rows,
        "cases": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        json.dump(run_llamafactory(), sys.stdout)
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(HERE.parents[2] / "bench/lf_stubs"),
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
    )
    output = subprocess.run([args.python, __file__, "--worker"], check=True, env=env, capture_output=True, text=True)
    GOLDEN.write_text(json.dumps(json.loads(output.stdout)) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
