"""The workflow benchmark: one sft config run by `lathe train` and by LLaMA-Factory's `llamafactory-cli train`.

    bench/setup_llamafactory.sh                  # once: bench/.venv-lf (LLaMA-Factory 0.9.5)
    python bench/workflow_bench.py               # ~10 min: bench/results/workflow-*.json, docs/BENCHMARKS_workflow.md
    python bench/workflow_bench.py --quick       # smoke run: 1 repeat, report under bench/results/

Shared assets are built once into bench/results/workflow/assets: a randomly initialised 2-layer Llama
saved with save_pretrained, a byte-level BPE tokenizer trained locally (same folder), and a synthetic
alpaca-format dataset with log-normal answer lengths, registered in a dataset_info.json.
Each measurement is a fresh process (OMP_NUM_THREADS=1, its own empty HOME so no tokenization or
`datasets` cache survives between runs) and the runners take turns; the report shows medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
WORK_DIR = BENCH_DIR / "results" / "workflow"
ASSETS = WORK_DIR / "assets"  # assets-h<hidden> with --hidden other than 64
LF_CLI = BENCH_DIR / ".venv-lf" / "bin" / "llamafactory-cli"
LF_STUBS = BENCH_DIR / "lf_stubs"
REPORT = REPO_ROOT / "docs" / "BENCHMARKS_workflow.md"

N_EXAMPLES, VOCAB, HIDDEN, CUTOFF_LEN, SEED = 800, 2048, 64, 512, 42
# Identical for every runner and configuration. LLaMA-Factory turns gradient checkpointing on unless told
# not to, lathe only when asked (gradient_checkpointing: true): switched off so both do the same compute.
HYPERPARAMETERS = dict(
    stage="sft",
    do_train=True,
    finetuning_type="full",
    template="default",
    cutoff_len=CUTOFF_LEN,
    overwrite_cache=True,
    preprocessing_num_workers=None,
    per_device_train_batch_size=8,
    gradient_accumulation_steps=1,
    learning_rate=1.0e-3,
    lr_scheduler_type="cosine",
    warmup_steps=0,
    num_train_epochs=1.0,
    max_grad_norm=1.0,
    seed=SEED,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    plot_loss=False,
    disable_tqdm=True,
    disable_gradient_checkpointing=True,
    overwrite_output_dir=True,
    dataloader_num_workers=0,
    bf16=False,
)
# (runner, configuration): the extra keys of that run. The target compares lathe-packed with LF-unpacked.
RUNS = {
    ("lathe", "unpacked"): {"packing": False},
    ("llamafactory", "unpacked"): {"packing": False},
    ("lathe", "packed"): {"packing": True, "neat_packing": True},
    ("llamafactory", "neat-packed"): {"packing": True, "neat_packing": True},
}
LOSS_LINE = re.compile(r"""['"]loss['"]\s*:\s*['"]?([0-9.eE+-]+)""")


# ------------------------------------------------------------------------------------------ assets
def synthetic_example(rng: random.Random, lexicon: list[str]) -> dict:
    """An alpaca row: a short instruction, sometimes an input, and an answer whose length is log-normal
    (median ~60 words, long tail cut at 300), the skewed shape of real instruction data."""

    def sentence(words: int) -> str:
        return " ".join(rng.choice(lexicon) for _ in range(words)) + "."

    answer_words = min(300, max(3, int(rng.lognormvariate(4.0, 0.8))))
    answer = " ".join(sentence(rng.randint(4, 12)) for _ in range(max(1, answer_words // 8)))
    return {
        "instruction": sentence(rng.randint(4, 20)),
        "input": sentence(rng.randint(3, 30)) if rng.random() < 0.4 else "",
        "output": answer,
    }


def build_assets() -> None:
    """Tokenizer, model and dataset, once (delete bench/results/workflow/assets to rebuild)."""
    if (ASSETS / "data" / "dataset_info.json").exists():
        return
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(SEED)
    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "pe", "da", "zu", "fen", "gor", "bel", "ix"]
    lexicon = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(800)]
    rows = [synthetic_example(rng, lexicon) for _ in range(N_EXAMPLES)]
    (ASSETS / "data").mkdir(parents=True, exist_ok=True)
    (ASSETS / "data" / "bench_sft.json").write_text(json.dumps(rows, indent=0))
    (ASSETS / "data" / "dataset_info.json").write_text(
        json.dumps(
            {
                "bench_sft": {
                    "file_name": "bench_sft.json",
                    "columns": {"prompt": "instruction", "query": "input", "response": "output"},
                }
            }
        )
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    texts = [" ".join(row.values()) for row in rows] + ["Human: System: Assistant:\n"] * 50
    tokenizer.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=["<pad>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.padding_side = "right"
    model_dir = ASSETS / "model"
    fast.save_pretrained(model_dir)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    LlamaForCausalLM(config).save_pretrained(model_dir)


def config_for(runner: str, configuration: str, output_dir: Path) -> dict:
    config = dict(
        HYPERPARAMETERS,
        model_name_or_path=str(ASSETS / "model"),
        dataset="bench_sft",
        dataset_dir=str(ASSETS / "data"),
        output_dir=str(output_dir),
        **RUNS[(runner, configuration)],
    )
    return {key: value for key, value in config.items() if value is not None}


def write_yaml(config: dict, path: Path) -> None:
    """Plain `key: value` lines; strings quoted, so OmegaConf (LLaMA-Factory) reads "no" as a string."""
    lines = [
        f"{key}: {json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else value}"
        for key, value in config.items()
    ]
    path.write_text("\n".join(lines) + "\n")


def count_example_tokens() -> dict:
    """The non-padding tokens one epoch trains on: every example's input_ids (prompt + answer, as the
    `default` template renders them), tokenized by lathe's sft pipeline without packing. Packing only
    rearranges these tokens into rows, so the count is the same for every run of one epoch."""
    import tempfile

    from lathe.llm.config.train import parse_train_config
    from lathe.llm.data.pipeline import get_dataset
    from lathe.llm.model.loader import load_tokenizer
    from lathe.llm.templates import get_template_and_fix_tokenizer

    with tempfile.TemporaryDirectory() as scratch:
        config = parse_train_config(config_for("lathe", "unpacked", Path(scratch) / "out"))
        tokenizer = load_tokenizer(config.model)
        template = get_template_and_fix_tokenizer(tokenizer, config.data)
        train = get_dataset(template, config.model, config.data, config.training, "sft", tokenizer, cache_dir=scratch)[
            "train_dataset"
        ]
        lengths = [len(ids) for ids in train["input_ids"]]
    batch = HYPERPARAMETERS["per_device_train_batch_size"]
    order = random.Random(0).sample(lengths, len(lengths))  # padded cost of random batches, for the report
    padded = sum(max(order[i : i + batch]) * len(order[i : i + batch]) for i in range(0, len(order), batch))
    return {
        "examples": len(lengths),
        "tokens": sum(lengths),
        "mean_length": statistics.mean(lengths),
        "median_length": statistics.median(lengths),
        "max_length": max(lengths),
        "padding_share_random_batches": 1 - sum(lengths) / padded,
    }


# ------------------------------------------------------------------------------------------ runs
def command_and_env(runner: str, config_path: Path, home: Path) -> tuple[list[str], dict]:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        HOME=str(home),
        MPLCONFIGDIR=str(WORK_DIR / "mplconfig"),
        DISABLE_VERSION_CHECK="1",
    )
    env.pop("HF_DATASETS_CACHE", None)
    if runner == "lathe":
        env["PYTHONPATH"] = str(REPO_ROOT)
        return [sys.executable, "-m", "lathe", "train", str(config_path)], env
    env["PYTHONPATH"] = str(LF_STUBS)
    return [str(LF_CLI), "train", str(config_path)], env


def run_once(runner: str, configuration: str, repeat: int) -> dict:
    """One fresh process. Its output lines are time-stamped as they arrive (PYTHONUNBUFFERED): the first
    logged loss (logging_steps: 1) marks the end of the first optimizer step."""
    run_dir = WORK_DIR / "runs" / f"{runner}-{configuration}"
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "home").mkdir(parents=True)
    config_path = run_dir / "config.yaml"
    write_yaml(config_for(runner, configuration, run_dir / "output"), config_path)
    command, env = command_and_env(runner, config_path, run_dir / "home")
    stamped = []
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=run_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        errors="replace",
    )
    for line in process.stdout:
        stamped.append((time.perf_counter() - start, process_cpu_s(process.pid), line.rstrip("\n")))
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    (run_dir / "output.log").write_text("".join(f"{t:8.3f} {cpu:8.3f} {line}\n" for t, cpu, line in stamped))
    record = {
        "runner": runner,
        "configuration": configuration,
        "repeat": repeat,
        "wall_s": wall,
        "rc": os.waitstatus_to_exitcode(status),
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "command": " ".join(command),
    }
    if record["rc"] != 0:
        record["error"] = "\n".join(line for _, _, line in stamped[-40:])
        return record
    record.update(parse_outputs(runner, stamped, run_dir / "output"))
    return record


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) the process has used so far: on a shared machine the less noisy clock."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def first_stamp(stamped, pattern: str, last: bool = False) -> tuple[float | None, float | None]:
    """(wall, cpu) seconds since spawn of the first (or last) output line matching `pattern`."""
    hits = [(t, cpu) for t, cpu, line in stamped if re.search(pattern, line)]
    return (hits[-1] if last else hits[0]) if hits else (None, None)


def span(begin, end, index: int):
    return end[index] - begin[index] if begin[index] is not None and end[index] is not None else None


# Where preprocessing starts and ends in each runner's output: from `datasets` starting to read the json
# file (its first progress line) to the runner's first line after tokenizing (lathe's split summary,
# LLaMA-Factory's printed example). Library imports before reading are start-up, not preprocessing.
PREPROCESS_MARKERS = {
    "lathe": (r"^Generating train split", r"train split: \d+ rows"),
    "llamafactory": (r"^Generating train split", r"^training example:"),
}


def parse_outputs(runner: str, stamped, output_dir: Path) -> dict:
    begin, end = (first_stamp(stamped, pattern) for pattern in PREPROCESS_MARKERS[runner])
    first_step, last_step = first_stamp(stamped, LOSS_LINE.pattern), first_stamp(stamped, LOSS_LINE.pattern, last=True)
    results = json.loads((output_dir / "all_results.json").read_text())
    state = json.loads((output_dir / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    return {
        "preprocess_s": span(begin, end, 0),
        "preprocess_cpu_s": span(begin, end, 1),
        "first_step_s": first_step[0],
        "first_step_cpu_s": first_step[1],
        # steps 2..N, between the first and the last logged loss: CPU time, and its share of the tokens
        "steps_after_first_cpu_s": span(first_step, last_step, 1),
        "train_runtime_s": results["train_runtime"],
        "train_loss": results["train_loss"],
        "final_loss": losses[-1] if losses else None,
        "losses": losses,
        "global_step": state["global_step"],
        "epoch": state.get("epoch"),
    }


# ------------------------------------------------------------------------------------------ report
def versions() -> dict:
    lf = subprocess.run(
        [
            str(BENCH_DIR / ".venv-lf" / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; print({p: m.version(p) for p in "
            "('llamafactory', 'torch', 'transformers', 'datasets', 'peft', 'trl', 'accelerate')})",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    import importlib.metadata as metadata

    ours = {p: metadata.version(p) for p in ("torch", "transformers", "datasets", "tokenizers")}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip()
    if subprocess.run(
        ["git", "status", "--porcelain", "--", "lathe"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip():
        commit += " + uncommitted changes in lathe/"
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {
        "lathe_commit": commit,
        "lathe_env": ours,
        "llamafactory_env": lf,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_start": os.getloadavg(),
    }


def median(records: list[dict], key: str):
    values = [record[key] for record in records if record.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(records: list[dict], tokens: int) -> dict:
    summary = {}
    for runner, configuration in RUNS:
        ok = [r for r in records if (r["runner"], r["configuration"]) == (runner, configuration) and r["rc"] == 0]
        if not ok:
            continue
        for record in ok:  # CPU clock: steps 2..N hold (N - 1) / N of the tokens (exact on average)
            record["tokens_per_cpu_s"] = (
                tokens
                * HYPERPARAMETERS["num_train_epochs"]
                * (record["global_step"] - 1)
                / record["global_step"]
                / record["steps_after_first_cpu_s"]
            )
        row = {
            key: median(ok, key)
            for key in (
                "preprocess_s",
                "preprocess_cpu_s",
                "first_step_s",
                "first_step_cpu_s",
                "train_runtime_s",
                "wall_s",
                "cpu_s",
                "peak_rss_mb",
                "train_loss",
                "final_loss",
                "global_step",
                "tokens_per_cpu_s",
            )
        }
        row["tokens_per_s"] = tokens * HYPERPARAMETERS["num_train_epochs"] / row["train_runtime_s"]
        row["repeats"] = len(ok)
        summary[f"{runner}/{configuration}"] = row
    return summary


def fmt(value, digits=2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def render(result: dict) -> str:
    s, t, info = result["summary"], result["tokens"], result["info"]
    model = json.loads((ASSETS / "model" / "config.json").read_text())
    lines = [
        "# Workflow benchmark: `lathe train` vs LLaMA-Factory `llamafactory-cli train` (sft, CPU)",
        "",
        f"Measured {result['date']} with `{result['command']}` (`bench/workflow_bench.py`; how to run it: "
        "bench/README.md).",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores shared with other work (load average at start "
        f"{', '.join(f'{x:.1f}' for x in info['load_average_start'])}), no GPU; every runner `OMP_NUM_THREADS=1`",
        f"- lathe {info['lathe_commit']}, system Python {info['python']}: {info['lathe_env']}",
        f"- LLaMA-Factory (bench/.venv-lf): {info['llamafactory_env']}",
        f"- model: random-init Llama, hidden {model['hidden_size']}, {model['num_hidden_layers']} layers, "
        f"{model['num_attention_heads']} heads, vocabulary {model['vocab_size']} (byte-level BPE trained locally), "
        f"{result.get('parameters', '?')} parameters, fp32, sdpa attention",
        f"- data: {t['examples']} synthetic alpaca rows, log-normal answer lengths; {t['tokens']:,} tokens with the "
        f"`default` template (per example: mean {t['mean_length']:.0f}, median {t['median_length']:.0f}, max "
        f"{t['max_length']}); random batches of {HYPERPARAMETERS['per_device_train_batch_size']} are "
        f"{t['padding_share_random_batches']:.0%} padding",
        "- the YAML both runners get: "
        + ", ".join(f"`{k}: {v}`" for k, v in HYPERPARAMETERS.items() if v is not None)
        + "; plus `packing` / `neat_packing` per configuration",
        f"- {result['repeats']} repeats of each run, interleaved; each a fresh process with an empty HOME (no "
        "tokenization or `datasets` cache); medians",
        "",
        "| runner / configuration | steps | preprocess s | start → 1st step s (CPU s) | train s | non-padding tokens/s "
        "(per CPU s) | process wall s (CPU s) | peak RSS MB | train_loss | last-step loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in s.items():
        lines.append(
            f"| {name} | {fmt(row['global_step'], 0)} | {fmt(row['preprocess_s'])} | {fmt(row['first_step_s'])} "
            f"({fmt(row['first_step_cpu_s'])}) | {fmt(row['train_runtime_s'])} | {fmt(row['tokens_per_s'], 0)} "
            f"({fmt(row['tokens_per_cpu_s'], 0)}) | {fmt(row['wall_s'], 1)} ({fmt(row['cpu_s'], 1)}) "
            f"| {fmt(row['peak_rss_mb'], 0)} | {fmt(row['train_loss'], 6)} | {fmt(row['final_loss'], 4)} |"
        )
    lines += ["", "## Targets", ""] + [f"- {verdict}" for verdict in verdicts(result)]
    return "\n".join(lines) + "\n"


def ratio_text(numerator: dict, denominator: dict, key: str, target: float, inverse: bool = False) -> str:
    """'2.10× (CPU clock 2.20×): met' for a row pair, on the wall clock and the CPU clock."""
    cpu_key = {"tokens_per_s": "tokens_per_cpu_s", "first_step_s": "first_step_cpu_s"}[key]
    ratios = []
    for k in (key, cpu_key):
        a, b = (denominator[k], numerator[k]) if inverse else (numerator[k], denominator[k])
        ratios.append(a / b)
    verdict = "met" if min(ratios) >= target else "missed" if max(ratios) < target else "met on one clock only"
    return f"{ratios[0]:.2f}× (CPU clock {ratios[1]:.2f}×), target ≥ {target:g}×: **{verdict}**"


def verdicts(result: dict) -> list[str]:
    s = result["summary"]
    out = []
    packed, lf, lathe = s.get("lathe/packed"), s.get("llamafactory/unpacked"), s.get("lathe/unpacked")
    if packed and lf:
        out.append(
            "non-padding tokens/s, lathe packed vs LLaMA-Factory unpacked: " + ratio_text(packed, lf, "tokens_per_s", 2)
        )
    if lathe and lf:
        out.append("start → first step, unpacked: " + ratio_text(lathe, lf, "first_step_s", 2, inverse=True))
        out.append(
            "start → first step, lathe packed vs LLaMA-Factory unpacked: "
            + ratio_text(packed, lf, "first_step_s", 2, inverse=True)
            if packed
            else ""
        )
        losses = {
            name: [
                r["train_loss"]
                for r in result["records"]
                if r.get("train_loss") is not None and f"{r['runner']}/{r['configuration']}" == name
            ]
            for name in ("lathe/unpacked", "llamafactory/unpacked")
        }
        difference = abs(lathe["train_loss"] - lf["train_loss"])
        spread = max(max(v) - min(v) for v in losses.values())
        out.append(
            f"final loss, packing off: train_loss lathe {lathe['train_loss']:.6f}, LLaMA-Factory "
            f"{lf['train_loss']:.6f} (|difference| {difference:.1e}; spread between repeats {spread:.1e}); "
            f"last-step loss {lathe['final_loss']:.4f} vs {lf['final_loss']:.4f}: "
            f"**{'met' if difference <= max(spread, 1e-4) else 'missed'}**"
        )
    return [line for line in out if line]


def _product(shape) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


NOTES_MARKER = "<!-- notes: written by hand, kept when the script rewrites the report -->"


def kept_notes(report: Path) -> str:
    """The hand-written analysis below NOTES_MARKER in the existing report, so a re-run keeps it."""
    text = report.read_text() if report.exists() else ""
    return "\n" + text[text.index(NOTES_MARKER) :] if NOTES_MARKER in text else ""


def main() -> int:
    global ASSETS, HIDDEN
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repeat, report under bench/results/")
    parser.add_argument(
        "--runs", default=",".join(f"{r}/{c}" for r, c in RUNS), help="comma-separated runner/configuration"
    )
    parser.add_argument("--report", type=Path, default=None)
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="model width (its own assets folder)")
    args = parser.parse_args()
    if args.hidden != HIDDEN:
        ASSETS, HIDDEN = WORK_DIR / f"assets-h{args.hidden}", args.hidden
    repeats = 1 if args.quick else args.repeats
    report = args.report or (WORK_DIR / "BENCHMARKS_workflow-quick.md" if args.quick else REPORT)
    selected = [tuple(item.split("/")) for item in args.runs.split(",")]
    if not LF_CLI.exists():
        print(f"{LF_CLI} is missing: run bench/setup_llamafactory.sh first", file=sys.stderr)
        return 2
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    build_assets()
    tokens = count_example_tokens()
    print(f"dataset: {tokens}", flush=True)
    records = []
    for repeat in range(repeats):
        for runner, configuration in selected:
            record = run_once(runner, configuration, repeat)
            records.append(record)
            print(
                f"[{time.strftime('%H:%M:%S')}] {runner}/{configuration} #{repeat}: rc={record['rc']} "
                f"wall={record['wall_s']:.1f}s first_step={fmt(record.get('first_step_s'))}s "
                f"train={fmt(record.get('train_runtime_s'))}s loss={fmt(record.get('train_loss'), 4)}"
                + (f"\n{record['error']}" if record["rc"] else ""),
                flush=True,
            )
    from safetensors import safe_open

    with safe_open(str(ASSETS / "model" / "model.safetensors"), "pt") as weights:
        parameters = sum(_product(weights.get_slice(name).get_shape()) for name in weights.keys())
    result = {
        "date": datetime.date.today().isoformat(),
        "parameters": f"{parameters:,}",
        "command": " ".join(["python", "bench/workflow_bench.py", *sys.argv[1:]]),
        "repeats": repeats,
        "info": versions(),
        "tokens": tokens,
        "records": records,
        "summary": summarise(records, tokens["tokens"]),
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (BENCH_DIR / "results" / f"workflow-{stamp}.json").write_text(json.dumps(result, indent=1))
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(render(result) + kept_notes(report))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
