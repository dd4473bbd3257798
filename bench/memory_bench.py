"""Peak memory, step time and step-1 loss of one sft job with Qwen2.5's 151,936-token vocabulary (a
small-hidden Qwen2-shaped model built from a config, batch 4 x 1024 tokens, fp32 on the CPU; full and LoRA)
under four runners, one process each, one after another:

- LLaMA-Factory 0.9.5 (bench/.venv-lf, `run_exp`),
- lathe (`lathe train`'s run_train; chunked cross-entropy is its default),
- plain PyTorch with transformers' loss (model(**batch).loss: full logits),
- plain PyTorch with chunked cross-entropy (the floor: hidden states from the base model, F.cross_entropy
  over 256-token chunks, each chunk checkpointed so its logits are recomputed in backward).

    python bench/memory_bench.py              # ~15 min on 2 cores: docs/BENCHMARKS_memory.md
    python bench/memory_bench.py --only lathe --methods full   # one runner, report under bench/results/

Peak memory is the process's peak RSS (ru_maxrss: loading included, as a user sees it); step time the
fastest step after the first (the least disturbed by other work); the loss is step 1's, as compute_loss
returned it. Every runner gets
OMP_NUM_THREADS=1 and the same 4 examples (one batch: every step sees the whole dataset) and runs with
gradient checkpointing, as LLaMA-Factory does by default. No GPU was available for this benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
WORK = BENCH_DIR / ".cache" / "memory"
RESULTS = BENCH_DIR / "results" / "memory.json"
REPORT = REPO_ROOT / "docs" / "BENCHMARKS_memory.md"
LF_PYTHON = Path(os.environ.get("LF_VENV", "/work/main/bench/.venv-lf")) / "bin" / "python"
LF_STUBS = Path(os.environ.get("LF_STUBS", "/work/main/bench/lf_stubs"))
BPE_SOURCE = REPO_ROOT / "tests" / "llm" / "golden" / "tokenizers" / "bpe" / "tokenizer.json"

VOCAB = 151_936  # Qwen2.5's padded embedding size; its tokenizer has 151,665 entries
MODEL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
COMMON = dict(
    stage="sft",
    do_train=True,
    dataset="bench",
    template="qwen",
    cutoff_len=1024,
    per_device_train_batch_size=4,
    learning_rate=1e-4,
    lr_scheduler_type="constant",
    max_steps=3,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    overwrite_output_dir=True,
    disable_tqdm=True,
    use_cpu=True,
    seed=42,
)
METHODS = {
    "full": {"finetuning_type": "full"},
    "lora": {"finetuning_type": "lora", "lora_rank": 8, "lora_alpha": 16, "lora_target": "all"},
}
RUNNERS = ("llamafactory", "lathe", "plain_transformers_loss", "plain_chunked")

# Each child measures itself and writes {"peak_mb", "step_s", "losses"} to argv[2].
MEASURE = r"""
import json, resource, sys, time
marks = {"step_s": [], "losses": []}
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def finish(path):
    marks["peak_mb"] = peak_mb()
    open(path, "w").write(json.dumps(marks))
"""
TRAINER_CHILD = (
    MEASURE
    + r"""
from transformers import TrainerCallback
class Clock(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()
    def on_step_end(self, args, state, control, **kwargs):
        marks["step_s"].append(time.perf_counter() - self.start)
def record(trainer_class):
    compute_loss = trainer_class.compute_loss
    def recording(self, model, inputs, return_outputs=False, **kwargs):
        result = compute_loss(self, model, inputs, return_outputs=return_outputs, **kwargs)
        marks["losses"].append((result[0] if return_outputs else result).item())
        return result
    trainer_class.compute_loss = recording
config = json.loads(open(sys.argv[1]).read())
"""
)
LLAMAFACTORY_CHILD = (
    TRAINER_CHILD.replace(
        "from transformers import TrainerCallback", "from transformers import TrainerCallback, Trainer"
    )
    + r"""
record(Trainer)
from llamafactory.train.tuner import run_exp
run_exp(config, callbacks=[Clock()])
finish(sys.argv[2])
"""
)
LATHE_CHILD = (
    TRAINER_CHILD.replace("from transformers import TrainerCallback", "from lathe import TrainerCallback, Trainer")
    + r"""
record(Trainer)
from lathe.llm.config.train import parse_train_config
from lathe.llm.workflows.stages import run_train
run_train(parse_train_config(config), callbacks=[Clock()])
finish(sys.argv[2])
"""
)
PLAIN_CHILD = (
    MEASURE
    + r"""
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM
config = json.loads(open(sys.argv[1]).read())
batch = {k: torch.tensor(v) for k, v in json.loads(open(sys.argv[3]).read()).items()}
chunked = sys.argv[4] == "chunked"
torch.manual_seed(config["seed"])
model = AutoModelForCausalLM.from_pretrained(config["model_name_or_path"], dtype=torch.float32)
model.config.use_cache = False
if config["finetuning_type"] == "lora":
    from peft import LoraConfig, get_peft_model
    targets = [n for n in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]
    model = get_peft_model(model, LoraConfig(r=config["lora_rank"], lora_alpha=config["lora_alpha"],
                                             lora_dropout=0.0, target_modules=targets))
    model.enable_input_require_grads()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
model.train()
base = model.get_base_model() if hasattr(model, "get_base_model") else model
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config["learning_rate"],
                              weight_decay=0.0)

def chunk_loss(hidden, labels):
    return F.cross_entropy(base.lm_head(hidden).float(), labels, reduction="sum")

def chunked_loss():
    hidden = base.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    labels = F.pad(batch["labels"], (0, 1), value=-100)[:, 1:].reshape(-1)
    kept = labels != -100
    rows, labels = hidden.reshape(-1, hidden.shape[-1])[kept], labels[kept]
    total = sum(checkpoint(chunk_loss, rows[i:i + 256], labels[i:i + 256], use_reentrant=False)
                for i in range(0, rows.shape[0], 256))
    return total / kept.sum()

for step in range(config["max_steps"]):
    start = time.perf_counter()
    loss = chunked_loss() if chunked else model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    marks["step_s"].append(time.perf_counter() - start)
    marks["losses"].append(loss.item())
finish(sys.argv[2])
"""
)


def build_tokenizer(folder: Path) -> None:
    """A byte-level BPE (the test tokenizer's merges) with filler entries up to Qwen2.5's 151,643 regular
    tokens, then <|endoftext|>, <|im_start|>, <|im_end|> at Qwen2.5's ids."""
    spec = json.loads(BPE_SOURCE.read_text())
    vocab = {token: index for token, index in spec["model"]["vocab"].items()}
    specials = {t["content"] for t in spec["added_tokens"]}
    regular = {token: index for token, index in vocab.items() if token not in specials}
    ordered = sorted(regular, key=regular.get)
    vocab = {token: index for index, token in enumerate(ordered)}
    for index in range(len(vocab), 151_643):
        vocab[f"<|filler_{index}|>"] = index
    added = []
    for offset, token in enumerate(("<|endoftext|>", "<|im_start|>", "<|im_end|>")):
        vocab[token] = 151_643 + offset
        added.append(
            {
                "id": 151_643 + offset,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    spec["model"]["vocab"], spec["added_tokens"] = vocab, added
    spec["post_processor"] = None
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "TokenizersBackend",
                "backend": "tokenizers",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 32768,
            }
        )
    )


def build_assets() -> dict:
    """The model (random weights, float32), the tokenizer and 4 long synthetic alpaca rows (each cut to 1024 tokens)."""
    model_dir, data_dir = WORK / "model", WORK / "data"
    if not (model_dir / "config.json").exists():
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        shutil.rmtree(model_dir, ignore_errors=True)
        model_dir.mkdir(parents=True)
        build_tokenizer(model_dir)
        torch.manual_seed(0)
        config = Qwen2Config(**MODEL, bos_token_id=151_643, eos_token_id=151_645, pad_token_id=151_643)
        Qwen2ForCausalLM(config).save_pretrained(str(model_dir))
    if not (data_dir / "dataset_info.json").exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        words = "the quick brown fox jumps over lazy dog what is two plus four sum add reverse string answer".split()
        rows = [
            {
                "instruction": " ".join(rng.choice(words) for _ in range(60)),
                "input": "",
                "output": " ".join(rng.choice(words) for _ in range(320)),
            }
            for _ in range(4)
        ]
        (data_dir / "train.json").write_text(json.dumps(rows))
        (data_dir / "dataset_info.json").write_text(json.dumps({"bench": {"file_name": "train.json"}}))
    return {"model": str(model_dir), "data": str(data_dir)}


def job_config(method: str, runner: str, assets: dict) -> dict:
    return {
        **COMMON,
        **METHODS[method],
        "model_name_or_path": assets["model"],
        "dataset_dir": assets["data"],
        "output_dir": str(WORK / "out" / f"{runner}-{method}"),
    }


def the_batch(config: dict) -> Path:
    """The 4 tokenized rows, collated once by lathe's sft pipeline (the plain runners train on them)."""
    path = WORK / "batch.json"
    if path.exists():
        return path
    code = r"""
import json, sys
from lathe.llm.config.train import parse_train_config
from lathe.llm.data.collator import SFTDataCollator
from lathe.llm.data.pipeline import get_dataset
from lathe.llm.model.loader import load_tokenizer
from lathe.llm.templates import get_template_and_fix_tokenizer
config = parse_train_config(json.loads(open(sys.argv[1]).read()))
tokenizer = load_tokenizer(config.model)
template = get_template_and_fix_tokenizer(tokenizer, config.data)
rows = get_dataset(template, config.model, config.data, config.training, stage="sft", tokenizer=tokenizer)["train_dataset"]
batch = SFTDataCollator(tokenizer=tokenizer, label_pad_token_id=-100)([rows[i] for i in range(len(rows))])
json.dump({k: batch[k].tolist() for k in ("input_ids", "attention_mask", "labels")}, open(sys.argv[2], "w"))
"""
    config_file = WORK / "batch-config.json"
    config_file.write_text(json.dumps({**config, "output_dir": str(WORK / "out" / "batch")}))
    subprocess.run([sys.executable, "-c", code, str(config_file), str(path)], env=child_env(), check=True)
    return path


def child_env(python_path: str = str(REPO_ROOT)) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=python_path, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")


def step_time(result: dict) -> float:
    """The fastest step after the first (which pays for first-touch allocations): the least disturbed by the
    other work on this shared machine."""
    return min(result["step_s"][1:] or result["step_s"])


def run(runner: str, method: str, assets: dict) -> dict:
    config = job_config(method, runner, assets)
    config_file, result_file = WORK / f"{runner}-{method}.json", WORK / f"{runner}-{method}.result.json"
    config_file.write_text(json.dumps(config))
    python, env = sys.executable, child_env()
    if runner == "llamafactory":
        command = [str(LF_PYTHON), "-c", LLAMAFACTORY_CHILD, str(config_file), str(result_file)]
        python, env = LF_PYTHON, child_env(str(LF_STUBS))
        command[0] = str(python)
    elif runner == "lathe":
        command = [python, "-c", LATHE_CHILD, str(config_file), str(result_file)]
    else:
        kind = "chunked" if runner == "plain_chunked" else "full"
        command = [python, "-c", PLAIN_CHILD, str(config_file), str(result_file), str(the_batch(config)), kind]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=WORK)
    if done.returncode != 0:
        raise RuntimeError(f"{runner} {method} failed:\n{done.stderr[-3000:]}")
    result = json.loads(result_file.read_text())
    result["step_time_s"] = step_time(result)
    print(
        f"{method:5s} {runner:24s} peak {result['peak_mb']:8.0f} MiB  step {result['step_time_s']:6.2f} s  "
        f"loss1 {result['losses'][0]:.6f}",
        flush=True,
    )
    return result


def free_gib() -> float:
    with open("/proc/meminfo") as meminfo:
        fields = {line.split(":")[0]: int(line.split()[1]) for line in meminfo}
    return fields["MemAvailable"] / 2**20


def loss_difference(ours: float, theirs: float) -> str:
    return "identical" if ours == theirs else f"{ours - theirs:+.1e}"


def summary(results: dict) -> list[str]:
    lines = []
    for method, rows in results.items():
        ours, peer = rows.get("lathe"), rows.get("llamafactory")
        if ours and peer:
            lines.append(
                f"- {method}: lathe's peak is {ours['peak_mb'] / peer['peak_mb']:.2f}x LLaMA-Factory's (target <= 0.2x), "
                f"its step {ours['step_time_s'] / peer['step_time_s']:.2f}x as long, its step-1 loss "
                f"{loss_difference(ours['losses'][0], peer['losses'][0])} ({ours['losses'][0]!r} vs {peer['losses'][0]!r}), "
                f"its losses of all {len(peer['losses'])} steps within "
                f"{max(abs(a - b) for a, b in zip(ours['losses'], peer['losses'])):.1e} of LLaMA-Factory's."
            )
    return lines + [""]


def report(results: dict) -> str:
    lines = [
        "# Memory: the 151,936-vocabulary sft job (bench/memory_bench.py)",
        "",
        f"Measured {datetime.date.today()} on this machine's CPU (fp32, OMP_NUM_THREADS=1 for every runner, one "
        "runner at a time). A small-hidden Qwen2-shaped model built from a config (hidden 64, 2 layers, tied "
        "embeddings, vocabulary 151,936), its BPE tokenizer built by the script, template qwen, batch 4 x 1024 "
        "tokens (4 examples cut to cutoff_len 1024: every step trains on the same batch), AdamW at lr 1e-4, "
        "gradient checkpointing on (LLaMA-Factory's default, also in the plain runners), 3 steps. "
        "Peak = the process's peak RSS (loading included); step = the fastest of steps 2-3; loss = step 1's, "
        "as compute_loss returned it. One fp32 logits tensor of this batch is 2,374 MiB.",
        "",
        "No GPU was lent to this task, so the GPU half of the benchmark (a Qwen2.5-0.5B-shaped model against "
        "LLaMA-Factory with and without Liger-Kernel: tokens/s, peak memory, MFU) has not been run.",
        "",
    ]
    lines += summary(results)
    for method in METHODS:
        rows = results.get(method, {})
        if not rows:
            continue
        peer = rows.get("llamafactory")
        lines += [
            f"## {method}",
            "",
            "| runner | peak RSS | vs LLaMA-Factory | step | vs LLaMA-Factory | step-1 loss | diff |",
            "|---|---|---|---|---|---|---|",
        ]
        for runner in RUNNERS:
            row = rows.get(runner)
            if row is None:
                continue
            ratio = f"{row['peak_mb'] / peer['peak_mb']:.2f}x" if peer else "-"
            speed = f"{row['step_time_s'] / peer['step_time_s']:.2f}x" if peer else "-"
            diff = "-" if not peer else loss_difference(row["losses"][0], peer["losses"][0])
            lines.append(
                f"| {runner} | {row['peak_mb']:,.0f} MiB | {ratio} | {row['step_time_s']:.2f} s | {speed} | "
                f"{row['losses'][0]:.6f} | {diff} |"
            )
        lines.append("")
    lines += NOTES
    return "\n".join(lines)


NOTES = [
    "## What the runners compute",
    "",
    "- **LLaMA-Factory** and **plain PyTorch, transformers' loss** build the logits of all 4 x 1024 positions "
    "(2,374 MiB in fp32) and transformers' ForCausalLMLoss keeps the log-probabilities for backward; backward "
    "adds their gradient and the logits' gradient: three tensors of that size alive at the peak.",
    "- **lathe** (`lathe train`, whose default is `chunked_cross_entropy: auto`; its log says `Causal-LM loss: "
    "chunked cross-entropy (LM head and loss over 256-token chunks; full-vocabulary logits are never built)`) "
    "takes the final hidden states at the LM head's input, keeps only the labelled positions, and for each "
    "256-token chunk computes the logits, the loss and, in the same pass, the gradients of the hidden states "
    "and of the head's weight (softmax minus the one-hot): one chunk of logits (~148 MiB) is alive at a time "
    "and nothing is recomputed (lathe/train/loss/chunked.py).",
    "- **plain PyTorch, chunked cross-entropy** (the floor the issue measured) runs the base model, then "
    "F.cross_entropy over 256-token chunks of the labelled positions, each chunk checkpointed (its logits "
    "recomputed in backward: one more head product per step than lathe).",
    "",
    "Step times are single-threaded on a 2-core machine shared with other work, so they vary by tens of "
    "percent from run to run; the ratios that matter here are far larger. lathe's steps are faster than "
    "LLaMA-Factory's because it does the same three head products without materialising, soft-maxing and "
    "copying 2.4 GB tensors several times, and it skips the prompt positions (labels -100) entirely.",
    "",
    "Reproduce: `python bench/memory_bench.py` (needs bench/.venv-lf, see bench/setup_llamafactory.sh; "
    "~25 min here; it refuses to start a run with less than 10 GiB available).",
    "",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=RUNNERS, default=list(RUNNERS))
    parser.add_argument("--methods", nargs="*", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--min-free-gib", type=float, default=10.0, help="wait-free check before each run")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report from bench/results/")
    options = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for rows in results.values():
        for row in rows.values():
            row["step_time_s"] = step_time(row)
    if not options.report_only:
        assets = build_assets()
        for method in options.methods:
            for runner in options.only:
                if free_gib() < options.min_free_gib:
                    raise SystemExit(f"only {free_gib():.1f} GiB free; the full-logits runs need ~9 GiB. Try later.")
                results.setdefault(method, {})[runner] = run(runner, method, assets)
                RESULTS.parent.mkdir(parents=True, exist_ok=True)
                RESULTS.write_text(json.dumps(results, indent=1))
    full = all(set(results.get(m, {})) == set(RUNNERS) for m in METHODS)
    text = report(results)
    (REPORT if full else RESULTS.with_suffix(".md")).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
