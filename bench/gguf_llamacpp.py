"""GGUF files written by `lathe export` (export_gguf) loaded by llama.cpp and compared with transformers.

For each case a small model with a real tokenizer is built from its config (trained-like weight scales, so
the top logits are not near-ties), exported with `lathe export` to f16, q8_0, q4_k_m, q5_k_m and q6_k
(the k-quants through llama.cpp's quantizer, found as `llama-quantize` on PATH: a stand-in that calls
llama-cpp-python's binding), and each file is run by llama.cpp (gguf_llamacpp_runner.py, in the venv of
llama-cpp-python) and compared with the exported folder run by transformers in float32:
token ids of varied strings, logits at every position of chat prompts, greedy continuations.

    # once: llama-cpp-python compiled into its own venv (~25+ min on 2 cores)
    python3.11 -m venv bench/.cache/llamacpp-venv && bench/.cache/llamacpp-venv/bin/pip install llama-cpp-python
    python bench/gguf_llamacpp.py [--python bench/.cache/llamacpp-venv/bin/python] [--cases llama3,qwen3,...]

Results: bench/results/gguf_llamacpp.json and a Markdown table (docs/GGUF.md records one run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "llm"))
WORK = ROOT / "bench" / ".cache" / "gguf-bench"
TYPES = ["f16", "q8_0", "q6_k", "q5_k_m", "q4_k_m"]
TEXTS = [
    "Hello world! I'm testing lathe's GGUF export.",
    "  leading spaces,\ttabs\tand\nnew\n\nlines   ",
    "def reverse(s: str) -> str:\n    return s[::-1]  # 3.14159 == π?",
    "Numbers 1 12 123 1234 12345 123456 and 3..3 3...3",
    "Ünïcödé: naïve café, 你好世界, привет мир, emoji 🦙🚀✅",
    "I've been 'told he's there, 'RE you sure? We'Ve a'lL",
    "!!!???......------======= ``` \"quoted\" ''",
    "The quick brown fox jumps over the lazy dog." * 3,
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Reverse the string: lathe"},
        {"role": "assistant", "content": "ehtal"},
        {"role": "user", "content": "And 'gguf'?"},
    ],
]
CASES = {  # name -> (tokenizer source, transformers config class, template, extra config)
    "llama3": ("npm:llama3", "LlamaConfig", "llama3", {}),
    "qwen3": ("npm:qwen3", "Qwen3Config", "qwen3_nothink", {"head_dim": 64}),
    "gemma3": (
        "npm:gemma3",
        "Gemma3TextConfig",
        "gemma3",
        {"head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 512, "layer_types": ["sliding_attention"] * 2},
    ),
    "llama2-spm": ("spm", "LlamaConfig", "llama2", {}),
}


def build_tokenizer(source: str, folder: Path) -> None:
    if source.startswith("npm:"):
        from real_tokenizers import npm_tokenizer

        for item in npm_tokenizer(source[4:]).iterdir():
            shutil.copy(item, folder / item.name)
    else:  # a Llama-2-style SentencePiece BPE with byte fallback, trained here
        from test_gguf import _sentencepiece_tokenizer

        _sentencepiece_tokenizer(folder, prepend=True)


def build_model(case: str, folder: Path) -> None:
    import transformers

    source, config_name, _, extra = CASES[case]
    folder.mkdir(parents=True)
    build_tokenizer(source, folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
    config = getattr(transformers, config_name)(
        vocab_size=size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        **extra,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with (
        torch.no_grad()
    ):  # trained-like scales: embeddings 0.25 (tied: logits of a few units), 1/sqrt(fan-in) matrices, norms near 1
        for name, parameter in model.named_parameters():
            if parameter.ndim == 2:
                std = 0.25 if "embed" in name else parameter.shape[1] ** -0.5
                parameter.normal_(0, std)
            elif "norm" in name:
                parameter.normal_(0.0 if config_name.startswith("Gemma") else 1.0, 0.1)
            else:
                parameter.normal_(0, 0.02)
    model.save_pretrained(str(folder))


def quantize_shim(python: str) -> Path:
    """`llama-quantize` on PATH for lathe: calls llama.cpp's quantizer through llama-cpp-python."""
    folder = WORK / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "llama-quantize"
    runner = ROOT / "bench" / "gguf_llamacpp_runner.py"
    shim.write_text(f'#!/bin/sh\nexec "{python}" "{runner}" quantize "$1" "$2" "$3"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return folder


def run_llama_cpp(python: str, job: dict) -> dict:
    runner = ROOT / "bench" / "gguf_llamacpp_runner.py"
    result = subprocess.run([python, str(runner)], input=json.dumps(job), capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"llama.cpp runner failed: {result.stderr[-2000:]}")
    return json.loads(result.stdout)


def hf_reference(folder: Path, prompts: list[list[int]], steps: int):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    logits, greedy = [], []
    with torch.no_grad():
        for ids in prompts:
            logits.append(model(torch.tensor([ids])).logits[0].numpy())
            sequence = list(ids)
            for _ in range(steps):
                sequence.append(int(model(torch.tensor([sequence])).logits[0, -1].argmax()))
            greedy.append(sequence[len(ids) :])
    return logits, greedy


def compare_case(case: str, python: str, steps: int) -> dict:
    import transformers

    from lathe.llm.export import export_model
    from lathe.llm.inference.config import parse_infer_config

    base, out = WORK / case / "base", WORK / case / case
    shutil.rmtree(WORK / case, ignore_errors=True)
    build_model(case, base)
    started = time.time()
    report = export_model(
        parse_infer_config(
            {
                "model_name_or_path": str(base),
                "template": CASES[case][2],
                "finetuning_type": "full",
                "export_dir": str(out),
                "export_gguf": TYPES,
            },
            command="export",
        )
    )
    export_seconds = time.time() - started
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    hf_tokens = [tokenizer(text)["input_ids"] for text in TEXTS]
    prompts = [
        list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"])
        for chat in CHATS
    ]
    hf_logits, hf_greedy = hf_reference(out, prompts, steps)
    lathe_prompts = lathe_renderings(tokenizer, CASES[case][2])
    generation = json.loads((out / "generation_config.json").read_text())
    stops = generation["eos_token_id"] if isinstance(generation["eos_token_id"], list) else [generation["eos_token_id"]]
    rows = []
    for gguf_file, _ in report.gguf_files:
        job = {
            "chats": CHATS,
            "gguf": gguf_file.path,
            "texts": TEXTS,
            "prompts": prompts,
            "greedy": steps,
            "eog_probe": stops,
            "out": str(WORK / case / gguf_file.type),
        }
        result = run_llama_cpp(python, job)
        differences, agree, total, scale = [], 0, 0, 0.0
        for path, reference in zip(result["logits"], hf_logits):
            ours = np.load(path)
            differences.append(np.abs(ours - reference).max())
            scale = max(scale, float(np.abs(reference).max()))
            agree += int((ours.argmax(-1) == reference.argmax(-1)).sum())
            total += len(reference)
        rows.append(
            {
                "type": gguf_file.type,
                "mb": round(gguf_file.bytes / 1e6, 1),
                "tokens_equal": sum(a == b for a, b in zip(result["tokens"], hf_tokens)),
                "texts": len(TEXTS),
                "max_abs_logit_diff": float(max(differences)),
                "max_abs_logit": scale,
                "top1_agreement": agree / total,
                "positions": total,
                "greedy_equal": sum(a == b for a, b in zip(result["greedy"], hf_greedy)),
                "prompts": len(prompts),
                "stops_are_eog": sorted(result["eog"]) == sorted(stops),
                "chat_template_equal": sum(a == b for a, b in zip(result["chat_prompts"], lathe_prompts)),
                "token_mismatches": [
                    {"text": t, "hf": b, "llama.cpp": a}
                    for t, a, b in zip(TEXTS, result["tokens"], hf_tokens)
                    if a != b
                ][:2],
            }
        )
    meta = report.gguf_files[0][0].tokenizer
    return {
        "case": case,
        "template": CASES[case][2],
        "vocab": len(tokenizer),
        "tokenizer": meta.get("model"),
        "pre": meta.get("pre"),
        "export_seconds": round(export_seconds, 1),
        "files": rows,
    }


def lathe_renderings(tokenizer, template_name: str) -> list[str]:
    """What lathe's template renders for CHATS with a generation prompt (the text before the answer)."""
    from lathe.llm.templates.registry import get_template

    template = get_template(template_name)
    prompts = []
    for chat in CHATS:
        system = chat[0]["content"] if chat[0]["role"] == "system" else None
        turns = chat[1:] if system else chat
        prompts.append(
            template.render_oneturn(tokenizer, turns + [{"role": "assistant", "content": "x"}], system=system)[0]
        )
    return prompts


def markdown(results: list[dict]) -> str:
    lines = [
        "| case | type | MB | token ids equal | max abs logit diff (max abs logit) | top-1 agreement | greedy equal | stops are EOG | chat template |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in results:
        for row in case["files"]:
            lines.append(
                f"| {case['case']} ({case['tokenizer']}/{case['pre']}, vocab {case['vocab']}) | {row['type']} | {row['mb']} | "
                f"{row['tokens_equal']}/{row['texts']} | {row['max_abs_logit_diff']:.2e} ({row['max_abs_logit']:.1f}) | "
                f"{row['top1_agreement']:.1%} of {row['positions']} | {row['greedy_equal']}/{row['prompts']} | "
                f"{'yes' if row['stops_are_eog'] else 'no'} | {row['chat_template_equal']}/{row['prompts']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=str(ROOT / "bench" / ".cache" / "llamacpp-venv" / "bin" / "python"))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=8, help="greedy tokens per prompt")
    args = parser.parse_args()
    os.environ["PATH"] = f"{quantize_shim(args.python)}{os.pathsep}{os.environ['PATH']}"
    results = [compare_case(case, args.python, args.steps) for case in args.cases.split(",")]
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "gguf_llamacpp.json").write_text(json.dumps(results, indent=1))
    print(markdown(results))
    for case in results:
        for row in case["files"]:
            for mismatch in row["token_mismatches"]:
                print(case["case"], row["type"], json.dumps(mismatch, ensure_ascii=False)[:400])


if __name__ == "__main__":
    main()
