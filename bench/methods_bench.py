"""Memory of the fine-tuning methods: full vs LoRA vs QLoRA (4-bit nf4, 8-bit) on a ~100M-parameter
Qwen2-shaped model built from a config, each trained a few steps by `lathe train` in a fresh process.

    python bench/methods_bench.py            # ~10 min on 2 cores: docs/BENCHMARKS_methods.md
    python bench/methods_bench.py --quick    # 1 step each, report under bench/results/ only

Per run: peak RSS of the whole process (loading included: reading a float32 checkpoint to quantize it
touches all of it), peak RSS while training (the kernel's high-water mark reset when training begins),
the bytes the model's parameters and buffers hold, the optimizer state's bytes, and the step losses.
CPU only here: RSS is the measure; on a GPU the same runs would report torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
WORK = BENCH_DIR / ".cache" / "methods"
REPORT = REPO_ROOT / "docs" / "BENCHMARKS_methods.md"
TOKENIZER = REPO_ROOT / "tests" / "llm" / "golden" / "tokenizers" / "bpe"

# Qwen2-shaped (GQA, tied embeddings, SwiGLU, biases on q/k/v): 12 layers of width 768.
MODEL = dict(
    vocab_size=32000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
COMMON = dict(
    stage="sft",
    do_train=True,
    dataset="bench",
    template="qwen",
    cutoff_len=256,
    per_device_train_batch_size=2,
    learning_rate=1e-4,
    lr_scheduler_type="constant",
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    overwrite_output_dir=True,
    disable_tqdm=True,
    seed=42,
)
RUNS = {
    "full": {"finetuning_type": "full"},
    "lora": {"finetuning_type": "lora", "lora_rank": 8, "lora_target": "all"},
    "qlora-4bit-nf4": {"finetuning_type": "lora", "lora_rank": 8, "lora_target": "all", "quantization_bit": 4},
    "qlora-8bit": {"finetuning_type": "lora", "lora_rank": 8, "lora_target": "all", "quantization_bit": 8},
}

CHILD = r'''
import json, sys, time
sys.path.insert(0, sys.argv[3])
from bench.measure import current_rss_mb, high_water_rss_mb, peak_rss_mb, reset_peak_rss
from lathe.train.callbacks.events import TrainerCallback

marks = {}
anon = {"process": 0, "training": 0}


def sample_anonymous_rss():
    """RssAnon every 5 ms: memory only the process holds (file pages a mapping keeps resident are the kernel's
    to drop, and transformers keeps the safetensors file mapped after quantized loading)."""
    import threading

    def loop():
        while True:
            with open("/proc/self/status") as status:
                value = next(int(line.split()[1]) for line in status if line.startswith("RssAnon:")) / 1024
            anon["process"] = max(anon["process"], value)
            anon["training"] = max(anon["training"], value)
            time.sleep(0.005)

    threading.Thread(target=loop, daemon=True).start()


sample_anonymous_rss()


def checkpoint_pages_mb():
    """Resident pages of mapped *.safetensors files (/proc/self/smaps): the checkpoint the model was read from."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                inside = line.rstrip().endswith(".safetensors")
            elif inside and first == "Rss:":
                total += int(line.split()[1])
    return total / 1024

class Memory(TrainerCallback):
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        import ctypes, gc
        marks["loading_peak_mb"] = peak_rss_mb()
        marks["model_bytes"] = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
        # Hand the heap that loading freed back to the kernel, so the training peak does not start from it.
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        marks["train_begin_mb"] = current_rss_mb()
        marks["reset"] = reset_peak_rss()
        anon["training"] = 0
        marks["start"] = time.perf_counter()

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        marks["optimizer_bytes"] = sum(v.numel() * v.element_size() for s in optimizer.state.values()
                                       for v in s.values() if hasattr(v, "numel"))

    def on_train_end(self, args, state, control, **kwargs):
        marks["training_peak_mb"] = high_water_rss_mb()
        marks["training_anonymous_peak_mb"] = anon["training"]
        marks["checkpoint_pages_mb"] = checkpoint_pages_mb()
        marks["train_s"] = time.perf_counter() - marks.pop("start")
        marks["losses"] = [entry["loss"] for entry in state.log_history if "loss" in entry]

from lathe.llm.commands import run_train
from lathe.llm.config.train import parse_train_config
from lathe.llm.model.adapters import count_parameters

config = parse_train_config(json.loads(open(sys.argv[1]).read()))
run_train(config, callbacks=[Memory()])
marks["process_peak_mb"] = peak_rss_mb()
marks["process_anonymous_peak_mb"] = anon["process"]
open(sys.argv[2], "w").write(json.dumps(marks))
'''


def build_assets() -> dict:
    """The model (random weights, float32 safetensors), the BPE test tokenizer and 256 synthetic alpaca rows."""
    model_dir, data_dir = WORK / "model", WORK / "data"
    if not (model_dir / "config.json").exists():
        import shutil

        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        model_dir.mkdir(parents=True, exist_ok=True)
        for item in TOKENIZER.iterdir():
            shutil.copy(item, model_dir / item.name)
        torch.manual_seed(0)
        Qwen2ForCausalLM(Qwen2Config(**MODEL)).save_pretrained(str(model_dir))
    if not (data_dir / "dataset_info.json").exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        words = "the quick brown fox jumps over lazy dog what is two plus four sum add reverse string answer".split()
        rows = [
            {
                "instruction": " ".join(rng.choice(words) for _ in range(rng.randint(8, 40))),
                "input": "",
                "output": " ".join(rng.choice(words) for _ in range(rng.randint(40, 200))),
            }
            for _ in range(256)
        ]
        (data_dir / "train.json").write_text(json.dumps(rows))
        (data_dir / "dataset_info.json").write_text(json.dumps({"bench": {"file_name": "train.json"}}))
    return {"model": str(model_dir), "data": str(data_dir)}


def run(name: str, assets: dict, steps: int) -> dict:
    config = {
        **COMMON,
        **RUNS[name],
        "max_steps": steps,
        "model_name_or_path": assets["model"],
        "dataset_dir": assets["data"],
        "output_dir": str(WORK / "out" / name),
    }
    config_file, result_file = WORK / f"{name}.json", WORK / f"{name}.result.json"
    config_file.write_text(json.dumps(config))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(config_file), str(result_file), str(REPO_ROOT)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    result = json.loads(result_file.read_text())
    print(
        f"{name}: process peak {result['process_peak_mb']:.0f} MB (anonymous {result['process_anonymous_peak_mb']:.0f}), "
        f"training peak {result['training_peak_mb']:.0f} MB (anonymous {result['training_anonymous_peak_mb']:.0f}), "
        f"model {result['model_bytes'] / 2**20:.0f} MiB, optimizer {result.get('optimizer_bytes', 0) / 2**20:.1f} MiB, "
        f"losses {result['losses']}",
        flush=True,
    )
    return result


def write_report(results: dict, steps: int, path: Path) -> None:
    from transformers import Qwen2Config

    parameters = _parameter_count(Qwen2Config(**MODEL))
    lines = [
        "# Memory of the fine-tuning methods (CPU)",
        "",
        f"Measured {datetime.date.today()} by `python bench/methods_bench.py` on {platform.machine()}, "
        f"{os.cpu_count()} cores, OMP_NUM_THREADS=1, torch CPU; bitsandbytes 0.50.2.",
        f"Model: Qwen2-shaped, {parameters / 1e6:.1f}M parameters ({MODEL['num_hidden_layers']} layers, width "
        f"{MODEL['hidden_size']}, vocabulary {MODEL['vocab_size']}, tied embeddings), float32 checkpoint built from a config. "
        f"Each method: `lathe train`, sft, batch {COMMON['per_device_train_batch_size']} x {COMMON['cutoff_len']} tokens, "
        f"AdamW, gradient checkpointing on (the default), {steps} steps, a fresh process each.",
        "",
        "| method | peak RSS MB | of which checkpoint file pages MB | peak RSS without unused checkpoint pages MB | anonymous peak MB | RSS at first step MB | model params+buffers MiB | optimizer state MiB | s/step | step losses |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, result in results.items():
        pages = result["checkpoint_pages_mb"]
        # LoRA computes with the checkpoint's pages (its frozen weights); full training writes its weights into
        # private copies and a quantized model holds its own, so for them the mapped pages are unused
        needed = result["process_peak_mb"] - (0 if name == "lora" else pages)
        lines.append(
            f"| {name} | {result['process_peak_mb']:.0f} | {pages:.0f} | {needed:.0f} | "
            f"{result['process_anonymous_peak_mb']:.0f} | {result['train_begin_mb']:.0f} | "
            f"{result['model_bytes'] / 2**20:.0f} | {result.get('optimizer_bytes', 0) / 2**20:.1f} | "
            f"{result['train_s'] / steps:.1f} | {', '.join(f'{loss:.4f}' for loss in result['losses'])} |"
        )
    lines += [
        "",
        "- *peak RSS* is what `top` shows; it counts the resident pages of mapped files. transformers maps the "
        "safetensors checkpoint: LoRA computes with those pages (its frozen float32 weights), while full training "
        "writes its weights into private copies and a quantized model holds its own, so for them the mapping stays "
        "resident but unused: clean page cache the kernel drops under pressure. *without unused checkpoint pages* "
        "subtracts them for every run but LoRA (measured in /proc/self/smaps at the end). *anonymous peak* (RssAnon, "
        "sampled every 5 ms) leaves out every file page, LoRA's weights included.",
        "- *RSS at first step*: after the heap that loading freed is handed back (malloc_trim); *training* peaks "
        "count from there (high-water mark reset through /proc/self/clear_refs).",
        "- Quantized linear layers hold 4 (or 8) bits per weight; the embeddings (tied with the output head) and "
        "norms stay float32; bitsandbytes' CPU kernels dequantize a layer's weights for each matmul.",
    ]
    # methods_examples.py's section of the same report stays
    marker = "## LLaMA-Factory's example configs of these methods"
    kept = path.read_text().split(marker, 1)[1] if path.exists() and marker in path.read_text() else None
    path.write_text("\n".join(lines) + "\n" + (f"\n{marker}{kept}" if kept else ""))
    print(f"wrote {path}")


def _parameter_count(config) -> int:
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 step per method; the report goes under bench/results/")
    parser.add_argument("--only", nargs="*", choices=list(RUNS), help="run only these methods")
    args = parser.parse_args()
    steps = 1 if args.quick else 3
    assets = build_assets()
    results = {name: run(name, assets, steps) for name in (args.only or RUNS)}
    report = BENCH_DIR / "results" / "methods-quick.md" if args.quick or args.only else REPORT
    report.parent.mkdir(parents=True, exist_ok=True)
    (BENCH_DIR / "results").mkdir(exist_ok=True)
    (BENCH_DIR / "results" / "methods.json").write_text(json.dumps(results, indent=1))
    write_report(results, steps, report)


if __name__ == "__main__":
    main()
