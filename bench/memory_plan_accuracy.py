"""The memory plan against measured peaks: runs tests/llm/memory_probe.py (a few training steps per
configuration, CPU peak RSS above the loaded process) with glibc's mmap threshold fixed at 64 KiB (RSS
follows what is allocated) and without it (plain RSS), and prints the markdown table of docs/MEMORY.md.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/memory_plan_accuracy.py
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"vocab": 8000, "hidden": 128, "intermediate": 384, "layers": 2, "heads": 4, "kv_heads": 2}
WIDE = {"vocab": 512, "hidden": 256, "intermediate": 768, "layers": 4, "heads": 8, "kv_heads": 4}
LARGE_VOCAB = {"vocab": 151936, "hidden": 128, "intermediate": 384, "layers": 2, "heads": 4, "kv_heads": 2}
LORA = {"finetuning_type": "lora", "lora_target": "all"}
FULL = {"finetuning_type": "full"}  # LLaMA-Factory's default is lora
CONFIGS = [
    ("full, vocab 8k, 4 x 256", {**SMALL, "batch": 4, "seq_len": 256, "checkpointing": False, "keys": FULL}),
    (
        "full, vocab 8k, checkpointing, 4 x 256",
        {**SMALL, "batch": 4, "seq_len": 256, "checkpointing": True, "keys": FULL},
    ),
    ("lora, vocab 8k, 4 x 256", {**SMALL, "batch": 4, "seq_len": 256, "checkpointing": False, "keys": LORA}),
    (
        "freeze (1 layer), vocab 8k, 4 x 256",
        {
            **SMALL,
            "batch": 4,
            "seq_len": 256,
            "checkpointing": False,
            "keys": {"finetuning_type": "freeze", "freeze_trainable_layers": 1},
        },
    ),
    ("full, wide, 4 x 256", {**WIDE, "batch": 4, "seq_len": 256, "checkpointing": False, "keys": FULL}),
    ("full, wide, checkpointing, 4 x 256", {**WIDE, "batch": 4, "seq_len": 256, "checkpointing": True, "keys": FULL}),
    (
        "lora (dropout 0.1), wide, 8 x 128",
        {**WIDE, "batch": 8, "seq_len": 128, "checkpointing": False, "keys": {**LORA, "lora_dropout": 0.1}},
    ),
    ("lora, wide, checkpointing, 4 x 256", {**WIDE, "batch": 4, "seq_len": 256, "checkpointing": True, "keys": LORA}),
    (
        "qlora (4-bit), wide, 4 x 256",
        {
            **WIDE,
            "saved": True,
            "batch": 4,
            "seq_len": 256,
            "checkpointing": False,
            "keys": {**LORA, "quantization_bit": 4},
        },
    ),
    (
        "full, vocab 151,936, 1 x 1024",
        {**LARGE_VOCAB, "batch": 1, "seq_len": 1024, "checkpointing": False, "keys": FULL},
    ),
    (
        "lora, vocab 151,936, 1 x 1024",
        {**LARGE_VOCAB, "batch": 1, "seq_len": 1024, "checkpointing": True, "keys": LORA},
    ),
]


def probe(specs: list[dict], env: dict) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    command = [sys.executable, str(ROOT / "tests/llm/memory_probe.py"), json.dumps(specs)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return [json.loads(line) for line in done.stdout.strip().splitlines()[-len(specs) :]]


def main() -> None:
    specs = [spec for _, spec in CONFIGS]
    fixed = probe(specs, {"MALLOC_MMAP_THRESHOLD_": "65536"})
    plain = probe(specs, {})
    mib = 2**20
    print("| run | planned | measured (threshold 64 KiB) | plan / measured | plain RSS | plan / plain RSS |")
    print("|---|---:|---:|---:|---:|---:|")
    for (name, _), one, two in zip(CONFIGS, fixed, plain):
        planned = one["planned"]
        print(
            f"| {name} | {planned / mib:,.1f} MiB | {one['measured'] / mib:,.1f} MiB | {planned / one['measured']:.3f} "
            f"| {two['measured'] / mib:,.1f} MiB | {planned / two['measured']:.3f} |"
        )


if __name__ == "__main__":
    main()
