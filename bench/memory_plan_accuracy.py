"""The memory plan against measured peaks: runs tests/llm/memory_probe.py (a few training steps per
configuration, CPU peak RSS above the loaded process) with glibc's mmap threshold fixed at 64 KiB (RSS
follows what is allocated) and without it (plain RSS), and prints the markdown table of docs/MEMORY.md.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/memory_plan_accuracy.py [preference | fsdp]

With `preference`, the stages dpo, kto and rm (their table in docs/MEMORY.md) instead of pt / sft; with
`fsdp`, FSDP2 runs on 2 CPU processes (torchrun, gloo), each process's plan against the larger of the two
measured peaks (threshold 64 KiB only), beside the plan of one process holding everything.
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

# Preference rows (tests/llm/memory_probe.py): chosen / target rows of seq_len tokens, the rejected / KL
# rows 24 shorter (padded), a 16-token unlabelled prompt; chunked log-probs unless said otherwise.
PREFERENCE_CONFIGS = [
    ("dpo, full, vocab 8k, 2 pairs x 256", {**SMALL, "batch": 2, "seq_len": 256, "checkpointing": False, "keys": FULL}),
    ("dpo, lora, vocab 8k, 2 pairs x 256", {**SMALL, "batch": 2, "seq_len": 256, "checkpointing": False, "keys": LORA}),
    (
        "dpo, full, vocab 8k, standard log-probs, 2 pairs x 256",
        {**SMALL, "batch": 2, "seq_len": 256, "checkpointing": False, "keys": {**FULL, "chunked_cross_entropy": "no"}},
    ),
    ("dpo, full, wide, 2 pairs x 256", {**WIDE, "batch": 2, "seq_len": 256, "checkpointing": False, "keys": FULL}),
    ("dpo, lora, wide, 2 pairs x 256", {**WIDE, "batch": 2, "seq_len": 256, "checkpointing": False, "keys": LORA}),
    (
        "dpo, lora, wide, checkpointing, 2 pairs x 256",
        {**WIDE, "batch": 2, "seq_len": 256, "checkpointing": True, "keys": LORA},
    ),
    (
        "dpo, lora, vocab 151,936, checkpointing, 1 pair x 512",
        {**LARGE_VOCAB, "batch": 1, "seq_len": 512, "checkpointing": True, "keys": LORA},
    ),
    ("kto, full, wide, 4 x 256", {**WIDE, "batch": 4, "seq_len": 256, "checkpointing": False, "keys": FULL}),
    (
        "kto, full, wide, checkpointing, 4 x 256",
        {**WIDE, "batch": 4, "seq_len": 256, "checkpointing": True, "keys": FULL},
    ),
    ("kto, lora, vocab 8k, 4 x 256", {**SMALL, "batch": 4, "seq_len": 256, "checkpointing": False, "keys": LORA}),
    ("rm, full, vocab 8k, 2 pairs x 256", {**SMALL, "batch": 2, "seq_len": 256, "checkpointing": False, "keys": FULL}),
    (
        "rm, lora, wide, checkpointing, 2 pairs x 256",
        {**WIDE, "batch": 2, "seq_len": 256, "checkpointing": True, "keys": LORA},
    ),
    (
        "rm, full, vocab 151,936, 1 pair x 512",
        {**LARGE_VOCAB, "batch": 1, "seq_len": 512, "checkpointing": False, "keys": FULL},
    ),
]
PREFERENCE_CONFIGS = [(name, {**spec, "stage": name.split(",")[0]}) for name, spec in PREFERENCE_CONFIGS]


# FSDP2 on 2 processes. "weights-bound": 4 layers, hidden 512, MLP 1536, 8/4 heads, vocabulary 512, 1 x 64
# tokens, so the sharded terms (weights, gradients, optimizer state) are most of the peak.
WEIGHTS_BOUND = {"vocab": 512, "hidden": 512, "intermediate": 1536, "layers": 4, "heads": 8, "kv_heads": 4}
SHARDED = {**FULL, "fsdp": "full_shard auto_wrap"}
FSDP_CONFIGS = [
    (
        "full_shard, weights-bound, 1 x 64",
        {**WEIGHTS_BOUND, "batch": 1, "seq_len": 64, "checkpointing": False, "keys": SHARDED},
    ),
    (
        "shard_grad_op, weights-bound, 1 x 64",
        {
            **WEIGHTS_BOUND,
            "batch": 1,
            "seq_len": 64,
            "checkpointing": False,
            "keys": {**FULL, "fsdp": "shard_grad_op auto_wrap"},
        },
    ),
    ("full_shard, wide, 4 x 256", {**WIDE, "batch": 4, "seq_len": 256, "checkpointing": False, "keys": SHARDED}),
    (
        "dpo, full_shard (reference sharded too), weights-bound, 1 pair x 64",
        {**WEIGHTS_BOUND, "stage": "dpo", "batch": 1, "seq_len": 64, "checkpointing": False, "keys": SHARDED},
    ),
]


def probe_launched(specs: list[dict], processes: int = 2) -> list[dict]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={processes}",
        f"--master_port={port}",
        str(ROOT / "tests/llm/memory_probe.py"),
        json.dumps(specs),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return [json.loads(line) for line in done.stdout.strip().splitlines() if line.startswith('{"measured"')]


def main_fsdp() -> None:
    sharded = probe_launched([spec for _, spec in FSDP_CONFIGS])
    whole = probe(
        [{**spec, "keys": {k: v for k, v in spec["keys"].items() if k != "fsdp"}} for _, spec in FSDP_CONFIGS],
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
    )
    mib = 2**20
    print("| run | planned per process | measured (larger of 2) | plan / measured | one process: planned | measured |")
    print("|---|---:|---:|---:|---:|---:|")
    for (name, _), one, alone in zip(FSDP_CONFIGS, sharded, whole):
        print(
            f"| {name} | {one['planned'] / mib:,.1f} MiB | {one['measured'] / mib:,.1f} MiB "
            f"| {one['planned'] / one['measured']:.3f} | {alone['planned'] / mib:,.1f} MiB | {alone['measured'] / mib:,.1f} MiB |"
        )


def probe(specs: list[dict], env: dict) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    command = [sys.executable, str(ROOT / "tests/llm/memory_probe.py"), json.dumps(specs)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return [json.loads(line) for line in done.stdout.strip().splitlines()[-len(specs) :]]


def main() -> None:
    if sys.argv[1:] == ["fsdp"]:
        return main_fsdp()
    configs = PREFERENCE_CONFIGS if sys.argv[1:] == ["preference"] else CONFIGS
    specs = [spec for _, spec in configs]
    fixed = probe(specs, {"MALLOC_MMAP_THRESHOLD_": "65536"})
    plain = probe(specs, {})
    mib = 2**20
    print("| run | planned | measured (threshold 64 KiB) | plan / measured | plain RSS | plan / plain RSS |")
    print("|---|---:|---:|---:|---:|---:|")
    for (name, _), one, two in zip(configs, fixed, plain):
        planned = one["planned"]
        print(
            f"| {name} | {planned / mib:,.1f} MiB | {one['measured'] / mib:,.1f} MiB | {planned / one['measured']:.3f} "
            f"| {two['measured'] / mib:,.1f} MiB | {planned / two['measured']:.3f} |"
        )


if __name__ == "__main__":
    main()
