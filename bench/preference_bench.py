"""Preference training, lathe against LLaMA-Factory 0.9.5, on the CPU:

1. examples: LLaMA-Factory's own dpo / kto / reward example configs (examples/train_lora/qwen3_lora_*.yaml)
   on its demo data (data/dpo_en_demo.json, kto_en_demo.json), run by both with only the model path,
   max_steps, bf16 (fp32 on the CPU) and dataset_dir changed; the train_loss of both is reported.
2. dpo: DPO step time and peak memory on one config, LoRA (the reference is the policy with its adapter
   off: no copy) and full fine-tuning (a frozen copy of the model), both runners.

    bench/setup_llamafactory.sh        # once: bench/.venv-lf
    python bench/preference_bench.py --llamafactory-git PATH   # ~10 min -> docs/BENCHMARKS_preference.md

PATH is a clone of github.com/hiyouga/LLaMA-Factory (a work tree or a bare git folder) holding the tag
v0.9.5: its examples/ and data/ are extracted under bench/.cache/ (git-ignored), never into the repository.
The tiny Qwen3-architecture model (random weights) and its BPE tokenizer (trained on the demo data, with
Qwen's special tokens) are built there too. Each measurement is a fresh process with OMP_NUM_THREADS=1
running this file as a worker in its runner's environment; the worker trains through the runner's own
entry point (lathe.llm.commands.run_train / llamafactory.train.tuner.run_exp) with a callback that times
the steps and samples the process's resident memory every 5 ms.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
CACHE = BENCH_DIR / ".cache" / "preference"
LF_FILES = CACHE / "llamafactory-v0.9.5"
REPORT = REPO_ROOT / "docs" / "BENCHMARKS_preference.md"
LF_PYTHON = [str(BENCH_DIR / ".venv-lf" / "bin" / "python")]  # --llamafactory-python replaces it
EXAMPLES = {
    "dpo": "examples/train_lora/qwen3_lora_dpo.yaml",
    "kto": "examples/train_lora/qwen3_lora_kto.yaml",
    "rm": "examples/train_lora/qwen3_lora_reward.yaml",
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# The DPO timing config: the demo pairs, 4 pairs per step, LLaMA-Factory's defaults otherwise.
DPO_BENCH = {
    "stage": "dpo",
    "do_train": True,
    "dataset": "dpo_en_demo",
    "template": "qwen3_nothink",
    "cutoff_len": 128,
    "max_samples": 200,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "max_steps": 16,
    "learning_rate": 5.0e-6,
    "lr_scheduler_type": "cosine",
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "bf16": False,
    "overwrite_output_dir": True,
    "overwrite_cache": True,
    "dataloader_num_workers": 0,
    "lora_rank": 8,
    "lora_target": "all",
    "pref_beta": 0.1,
    "disable_tqdm": True,
}
TIMED_FROM_STEP = 4  # steps before this warm up caches and allocators
MODEL_FACTS = {
    "examples": "Qwen3 architecture, hidden 64, 2 layers",
    "dpo": "Qwen3 architecture, hidden 512, 6 layers (21M parameters)",
}


# ---------------------------------------------------------------------------------------- assets
def extract_llamafactory_files(git_path: str) -> None:
    """examples/ and data/ of the v0.9.5 tag, once."""
    if (LF_FILES / "data" / "dataset_info.json").is_file():
        return
    git_dir = Path(git_path) / ".git" if (Path(git_path) / ".git").exists() else Path(git_path)
    LF_FILES.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", "v0.9.5", "examples", "data"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(LF_FILES)], input=archive, check=True)


def build_model(folder: Path, hidden: int, layers: int) -> None:
    """A Qwen3-architecture model with random weights and a BPE tokenizer trained on the demo data."""
    if (folder / "config.json").is_file():
        return
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    texts = []
    for name in ("dpo_en_demo.json", "kto_en_demo.json"):
        for row in json.loads((LF_FILES / "data" / name).read_text(encoding="utf-8")):
            texts += [
                message.get("value") or message.get("content")
                for message in row.get("conversations", row.get("messages", []))
            ]
            texts += [row[side]["value"] for side in ("chosen", "rejected") if side in row]
    backend = Tokenizer(models.BPE(unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=2048, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.save_pretrained(str(folder))
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=hidden // 8,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(str(folder))


# ---------------------------------------------------------------------------------------- worker
def resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measuring_callback(base):
    """A callback of the runner's own TrainerCallback class: step times, and the resident memory sampled
    from the start of training to its end."""

    class Measure(base):
        def __init__(self):
            self.steps, self.cpu_steps, self.peak, self.start_rss, self.running = [], [], 0, 0, False

        def _sample(self):
            while self.running:
                self.peak = max(self.peak, resident_bytes())
                time.sleep(0.005)

        def on_train_begin(self, args, state, control, **kwargs):
            self.start_rss = self.peak = resident_bytes()
            self.running = True
            threading.Thread(target=self._sample, daemon=True).start()

        def on_step_begin(self, args, state, control, **kwargs):
            self.step_start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            # CPU time of the process (one thread): what the step computed, whatever else the machine runs
            self.steps.append(time.perf_counter() - self.step_start)
            self.cpu_steps.append(time.process_time() - self.cpu_start)

        def on_train_end(self, args, state, control, **kwargs):
            self.running = False
            self.log_history = list(state.log_history)

    return Measure()


def patch_trl_availability_flags() -> None:
    """TRL 0.24 under transformers 5.6 reads (found, version) tuples as booleans and imports mergekit;
    keep the first element (see tests/llm/golden/make_llamafactory_preference.py)."""
    import trl.import_utils as flags

    for name in dir(flags):
        if name.startswith("_") and name.endswith("_available") and isinstance(getattr(flags, name), tuple):
            setattr(flags, name, getattr(flags, name)[0])


def run_worker(runner: str, config: dict) -> dict:
    started = time.time()
    if runner == "lathe":
        from lathe.llm.commands import run_train
        from lathe.llm.config.train import parse_train_config
        from lathe.train.callbacks.events import TrainerCallback

        callback = measuring_callback(TrainerCallback)
        run_train(parse_train_config(config), callbacks=[callback])
    else:
        from transformers import TrainerCallback

        patch_trl_availability_flags()
        from llamafactory.train.tuner import run_exp

        callback = measuring_callback(TrainerCallback)
        run_exp(config, callbacks=[callback])
    losses = [entry["loss"] for entry in callback.log_history if "loss" in entry]
    final = next(entry for entry in reversed(callback.log_history) if "train_loss" in entry)
    timed = callback.steps[TIMED_FROM_STEP - 1 :] or callback.steps
    cpu = callback.cpu_steps[TIMED_FROM_STEP - 1 :] or callback.cpu_steps
    return {
        "runner": runner,
        "wall_s": time.time() - started,
        "step_s": statistics.median(timed),
        "step_cpu_s": statistics.median(cpu),
        "steps": len(callback.steps),
        "peak_rss_mb": callback.peak / 2**20,
        "training_rss_mb": (callback.peak - callback.start_rss) / 2**20,
        "start_rss_mb": callback.start_rss / 2**20,
        "losses": losses,
        "train_loss": final["train_loss"],
    }


def measure(runner: str, config: dict, work: Path) -> dict:
    """One run in a fresh process of the runner's Python, with its own empty HOME (no caches)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(config))
    python = sys.executable if runner == "lathe" else LF_PYTHON[0]
    # bench/.venv-lf/bin/python -> bench/lf_stubs (the stand-in torchaudio made by setup_llamafactory.sh)
    path = str(REPO_ROOT) if runner == "lathe" else str(Path(os.path.abspath(LF_PYTHON[0])).parents[2] / "lf_stubs")
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=path,
        HOME=str(work / "home"),
        HF_HOME=str(work / "hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    result = subprocess.run(
        [python, __file__, "--worker", runner, str(work / "config.json"), str(work / "result.json")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{runner} failed in {work}:\n{result.stderr[-3000:]}")
    return json.loads((work / "result.json").read_text())


# ---------------------------------------------------------------------------------------- runs
def example_config(stage: str, model: Path, output_dir: Path) -> dict:
    import yaml

    config = yaml.safe_load((LF_FILES / EXAMPLES[stage]).read_text())
    # The only changes: where the model and data are, a few steps, fp32 on the CPU, where outputs go.
    config.update(
        model_name_or_path=str(model),
        dataset_dir=str(LF_FILES / "data"),
        max_steps=3,
        bf16=False,
        output_dir=str(output_dir),
    )
    return config


def run_examples(model: Path, work: Path) -> list[dict]:
    rows = []
    for stage in EXAMPLES:
        for runner in ("lathe", "llamafactory"):
            print(f"example {stage}: {runner}", flush=True)
            result = measure(
                runner, example_config(stage, model, work / f"{stage}-{runner}" / "out"), work / f"{stage}-{runner}"
            )
            rows.append({"example": EXAMPLES[stage], **result})
    return rows


def run_dpo(model: Path, work: Path, repeats: int) -> list[dict]:
    rows = []
    for repeat in range(repeats):
        for method in ("lora", "full"):
            for runner in ("lathe", "llamafactory"):
                print(f"dpo {method} repeat {repeat + 1}: {runner}", flush=True)
                config = {
                    **DPO_BENCH,
                    "model_name_or_path": str(model),
                    "dataset_dir": str(LF_FILES / "data"),
                    "finetuning_type": method,
                    "learning_rate": 5.0e-6 if method == "lora" else 1.0e-6,
                    "output_dir": str(work / f"{method}-{runner}-{repeat}" / "out"),
                }
                rows.append(
                    {
                        "method": method,
                        "repeat": repeat,
                        **measure(runner, config, work / f"{method}-{runner}-{repeat}"),
                    }
                )
    return rows


# ---------------------------------------------------------------------------------------- report
def report(examples: list[dict], dpo: list[dict], model_facts: dict) -> str:
    lines = [
        "# Preference training vs LLaMA-Factory 0.9.5 (CPU)",
        "",
        f"Made by `python bench/preference_bench.py` on {datetime.date.today()} ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, OMP_NUM_THREADS=1, one process per run). Model: {model_facts['examples']} for the "
        f"examples, {model_facts['dpo']} for the timings (random weights; tokenizer trained on the demo data).",
        "",
        "## LLaMA-Factory's own example configs and demo data",
        "",
        "Each config as LLaMA-Factory ships it, with model_name_or_path, dataset_dir, max_steps: 3, bf16: false and "
        "output_dir changed (3 steps of 8 examples: batch 1 x accumulation 8).",
        "",
        "| example | lathe train_loss | LLaMA-Factory train_loss | lathe wall (s) | LLaMA-Factory wall (s) |",
        "|---|---|---|---|---|",
    ]
    for example in dict.fromkeys(row["example"] for row in examples):
        ours = next(row for row in examples if row["example"] == example and row["runner"] == "lathe")
        theirs = next(row for row in examples if row["example"] == example and row["runner"] == "llamafactory")
        lines.append(
            f"| `{example}` | {ours['train_loss']:.6f} | {theirs['train_loss']:.6f} | {ours['wall_s']:.1f} | {theirs['wall_s']:.1f} |"
        )
    lines += [
        "",
        "## DPO step time and memory",
        "",
        f"`{json.dumps({k: v for k, v in DPO_BENCH.items() if k not in ('report_to', 'disable_tqdm', 'overwrite_cache', 'overwrite_output_dir')})}`, "
        f"median step time from step {TIMED_FROM_STEP}: CPU time of the process (one thread, so what the step computed) "
        "and wall time (which the other jobs on this shared machine inflate); peak resident memory of the process during "
        "training, the memory at its start, and the rise (the weights are memory-mapped, so the reference copy and the "
        "optimizer state show up in the rise). Medians of the repeats.",
        "",
        "| method | runner | step CPU (ms) | step wall (ms) | peak RSS (MB) | RSS at train start (MB) | rise during training (MB) | first losses |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in ("lora", "full"):
        for runner in ("lathe", "llamafactory"):
            runs = [row for row in dpo if row["method"] == method and row["runner"] == runner]
            step = statistics.median(row["step_s"] for row in runs) * 1000
            cpu = statistics.median(row["step_cpu_s"] for row in runs) * 1000
            peak = statistics.median(row["peak_rss_mb"] for row in runs)
            start = statistics.median(row["start_rss_mb"] for row in runs)
            rise = statistics.median(row["training_rss_mb"] for row in runs)
            losses = ", ".join(f"{loss:.6f}" for loss in runs[0]["losses"][:3])
            lines.append(
                f"| {method} | {runner} | {cpu:.0f} | {step:.0f} | {peak:.0f} | {start:.0f} | {rise:.0f} | {losses} |"
            )
    lines += ["", _summary(dpo)]
    return "\n".join(lines) + "\n"


def _summary(dpo: list[dict]) -> str:
    def median(method, runner, key):
        return statistics.median(row[key] for row in dpo if row["method"] == method and row["runner"] == runner)

    parts = []
    for runner in ("lathe", "llamafactory"):
        saved = median("full", runner, "peak_rss_mb") - median("lora", runner, "peak_rss_mb")
        parts.append(
            f"{runner}: LoRA, whose reference is the policy with its adapter off, peaks {saved:.0f} MB below full "
            f"fine-tuning (a frozen copy of the weights, plus their gradients and optimizer state)"
        )
    cpu = {
        method: median(method, "lathe", "step_cpu_s") / median(method, "llamafactory", "step_cpu_s")
        for method in ("lora", "full")
    }
    return (
        "; ".join(parts)
        + ". lathe's CPU time per step is "
        + ", ".join(f"{ratio:.3f}x LLaMA-Factory's ({method})" for method, ratio in cpu.items())
        + "; the first losses are the same numbers. Wall times vary with the other jobs on this shared machine."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--llamafactory-git", help="a LLaMA-Factory clone with the v0.9.5 tag (work tree or git folder)"
    )
    parser.add_argument("--llamafactory-python", default=LF_PYTHON[0], help="LLaMA-Factory's Python (bench/.venv-lf)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip", default="", help="comma list: examples, dpo")
    parser.add_argument("--report", default=str(REPORT))
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report from bench/.cache/preference/results.json"
    )
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        runner, config_path, result_path = args.worker
        result = run_worker(runner, json.loads(Path(config_path).read_text()))
        Path(result_path).write_text(json.dumps(result))
        return
    LF_PYTHON[0] = args.llamafactory_python
    if args.report_only:
        saved = json.loads((CACHE / "results.json").read_text())
        Path(args.report).write_text(report(saved["examples"], saved["dpo"], MODEL_FACTS))
        print(f"wrote {args.report}")
        return
    if not (LF_FILES / "data" / "dataset_info.json").is_file():
        if not args.llamafactory_git:
            raise SystemExit(
                "--llamafactory-git PATH is needed once: a clone of github.com/hiyouga/LLaMA-Factory with tag v0.9.5"
            )
        extract_llamafactory_files(args.llamafactory_git)
    # The timing model is large enough (21M parameters) for its weights, and a reference copy of them, to
    # weigh in the memory; the sequences are short so that CPU steps stay at a few seconds.
    small, bigger = CACHE / "model-h64", CACHE / "model-h512"
    build_model(small, hidden=64, layers=2)
    build_model(bigger, hidden=512, layers=6)
    skip = set(filter(None, args.skip.split(",")))
    results_file = CACHE / "results.json"
    previous = json.loads(results_file.read_text()) if results_file.is_file() else {}  # what --skip leaves out
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        work = Path(scratch)
        examples = previous.get("examples", []) if "examples" in skip else run_examples(small, work / "examples")
        dpo = previous.get("dpo", []) if "dpo" in skip else run_dpo(bigger, work / "dpo", args.repeats)
    results_file.write_text(json.dumps({"examples": examples, "dpo": dpo}, indent=1))
    if examples and dpo:
        Path(args.report).write_text(report(examples, dpo, MODEL_FACTS))
        print(f"wrote {args.report}")
    print(json.dumps({"examples": examples, "dpo": dpo}, indent=1)[:4000])


if __name__ == "__main__":
    main()
