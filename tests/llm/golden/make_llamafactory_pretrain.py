"""Regenerate LLaMA-Factory's pre-training blocks that tests/llm/test_pretrain.py compares lathe against.

    python tests/llm/golden/make_llamafactory_pretrain.py [--python bench/.venv-lf/bin/python]

Runs this same file in LLaMA-Factory's environment (`--worker`, where lathe is not imported): the
documents below are cut by LLaMA-Factory 0.9.5's `PretrainDatasetProcessor` (packing on, as for stage pt)
batch by batch, as `datasets.map(batched=True, batch_size=preprocessing_batch_size)` calls it, with the
committed BPE tokenizer (tests/llm/golden/tokenizers/bpe), with and without `add_bos_token`. Writes
tests/llm/golden/llamafactory_pretrain.json with the versions that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_pretrain.json"
TOKENIZER = HERE / "tokenizers" / "bpe"

WORDS = (
    "The quick brown fox jumps over the lazy dog . What is two plus two ? Two plus two is four . "
    "Reverse the string abc : cba . You are a helpful assistant ."
).split()
# 23 documents of 0 to 30 words (one empty): a fixed, varied sample; the tokenizer turns them into ~500 tokens.
DOCUMENT_WORDS = [7, 0, 12, 3, 30, 1, 9, 18, 5, 22, 2, 14, 8, 27, 4, 11, 6, 19, 1, 25, 10, 3, 16]
CASES = [
    {"add_bos_token": False, "cutoff_len": 16, "preprocessing_batch_size": 1000},  # one batch: only its tail dropped
    {"add_bos_token": False, "cutoff_len": 16, "preprocessing_batch_size": 4},  # a tail dropped per batch of 4
    {
        "add_bos_token": True,
        "cutoff_len": 16,
        "preprocessing_batch_size": 1000,
    },  # BOS written over each block's first token
]


def documents() -> list[str]:
    texts, cursor = [], 0
    for count in DOCUMENT_WORDS:
        texts.append(" ".join(WORDS[(cursor + i) % len(WORDS)] for i in range(count)))
        cursor += count
    return texts


def run_llamafactory() -> dict:
    from types import SimpleNamespace

    import llamafactory
    import transformers
    from llamafactory.data.processor.pretrain import PretrainDatasetProcessor
    from transformers import AutoTokenizer

    texts = documents()
    results = []
    for case in CASES:
        tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
        tokenizer.add_bos_token = case["add_bos_token"]
        data_args = SimpleNamespace(template=None, packing=True, cutoff_len=case["cutoff_len"])
        processor = PretrainDatasetProcessor(template=None, tokenizer=tokenizer, processor=None, data_args=data_args)
        size, blocks = case["preprocessing_batch_size"], []
        for start in range(0, len(texts), size):
            batch = {"_prompt": [[{"role": "user", "content": text}] for text in texts[start : start + size]]}
            blocks += processor.preprocess_dataset(batch)["input_ids"]
        results.append({**case, "input_ids": blocks})
    return {
        "versions": {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__},
        "tokenizer": "bpe",
        "documents": texts,
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
    )
    output = subprocess.run([args.python, __file__, "--worker"], check=True, env=env, capture_output=True, text=True)
    GOLDEN.write_text(json.dumps(json.loads(output.stdout), indent=None) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
