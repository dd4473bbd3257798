"""LLaMA-Factory 0.9.5's own example configs of the fine-tuning methods (QLoRA, LoRA+, PiSSA, OFT, LLaMA Pro),
run by `lathe train` and by `llamafactory-cli train` with only the model path, output_dir, max_steps and fp32 changed.

    python bench/methods_examples.py --lf_repo PATH     # a checkout of LLaMA-Factory at tag v0.9.5 (examples/, data/)

The configs and data stay outside the repository (read from the checkout, written under bench/.cache/).
The model is a tiny 8-layer Llama built from a config with the BPE test tokenizer (it has the llama3 and
qwen special tokens); the LLaMA Pro example trains it expanded by `lathe expand` (8 blocks added, as its
expand.sh does). Prints, per example: ran / refused (with lathe's one-line reason), each tool's logged step
losses, and whether they are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
WORK = BENCH_DIR / ".cache" / "methods-examples"
LF_PYTHON = Path("/work/main/bench/.venv-lf/bin/python")
EXAMPLES = [
    "train_qlora/qwen3_lora_sft_otfq.yaml",
    "train_qlora/qwen3_lora_sft_bnb_npu.yaml",
    "train_qlora/llama3_lora_sft_gptq.yaml",
    "train_qlora/llama3_lora_sft_awq.yaml",
    "train_qlora/llama3_lora_sft_aqlm.yaml",
    "extras/loraplus/llama3_lora_sft.yaml",
    "extras/pissa/llama3_lora_sft.yaml",
    "extras/oft/llama3_oft_sft.yaml",
    "extras/qoft/llama3_oft_sft_bnb_npu.yaml",
    "extras/qoft/llama3_oft_sft_awq.yaml",
    "extras/qoft/llama3_oft_sft_gptq.yaml",
    "extras/llama_pro/llama3_freeze_sft.yaml",
    "extras/fsdp_qlora/llama3_lora_sft.yaml",
]
PREQUANTIZED = ("gptq", "awq", "aqlm")  # hub checkpoints quantized with those libraries: stand-ins below


def build_model(folder: Path, layers: int = 8) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    for item in (REPO_ROOT / "tests/llm/golden/tokenizers/bpe").iterdir():
        shutil.copy(item, folder / item.name)
    vocab = len(AutoTokenizer.from_pretrained(str(folder)))
    torch.manual_seed(0)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
        )
    ).save_pretrained(str(folder))


def prequantized_stand_in(base: Path, method: str) -> Path:
    """The tiny model with a `quantization_config` of `method` in its config.json: what a hub checkpoint of that
    kind declares, so each tool's loader takes its pre-quantized path (and needs that library)."""
    folder = WORK / f"model-{method}"
    if not folder.exists():
        shutil.copytree(base, folder)
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": 32}
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def adapted(example: str, config: dict, models: dict, data_dir: Path, runner: str) -> dict:
    import yaml  # noqa: F401  (the config was read with it)

    config = dict(config)
    kind = next((method for method in PREQUANTIZED if method in example), None)
    config["model_name_or_path"] = str(
        models["pro"]
        if "llama_pro" in example
        else prequantized_stand_in(models["base"], kind)
        if kind
        else models["base"]
    )
    config["output_dir"] = str(WORK / "out" / runner / example.replace("/", "_").removesuffix(".yaml"))
    config["max_steps"] = 4  # warmup_ratio 0.1 makes step 1 a zero-rate step: steps 2-4 train
    config["bf16"] = False  # fp32 on the CPU
    config["dataset_dir"] = str(data_dir)
    if runner == "llamafactory":
        config["use_cpu"] = True
    return config


def run_lathe(config: dict) -> tuple[int, str]:
    path = WORK / "config.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "lathe", "train", str(path)], env=env, capture_output=True, text=True)
    return done.returncode, done.stderr


def run_llamafactory(config: dict) -> tuple[int, str]:
    path = WORK / "config-lf.json"
    path.write_text(json.dumps(config))
    env = dict(
        os.environ,
        PYTHONPATH=str(LF_PYTHON.parents[2] / "lf_stubs"),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    code = f"import json; from llamafactory.train.tuner import run_exp; run_exp(json.load(open({str(path)!r})))"
    done = subprocess.run([str(LF_PYTHON), "-c", code], env=env, capture_output=True, text=True)
    return done.returncode, done.stderr


def logged_losses(output_dir: str) -> list[float]:
    """The step losses in trainer_log.jsonl, then train_loss (the mean over all steps) from all_results.json:
    with the examples' logging_steps (10) and 2 steps, train_loss is what both tools report."""
    log, results = Path(output_dir) / "trainer_log.jsonl", Path(output_dir) / "all_results.json"
    losses = (
        [entry["loss"] for entry in map(json.loads, log.read_text().splitlines()) if "loss" in entry]
        if log.exists()
        else []
    )
    return losses + ([json.loads(results.read_text())["train_loss"]] if results.exists() else [])


def last_line(stderr: str) -> str:
    """lathe's one-line error (`lathe train: error: ...`), else the last line of a traceback."""
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith((" ", "\t", "Traceback"))]
    errors = [line for line in lines if "error:" in line or "Error" in line]
    return (errors or lines or [""])[-1][:300]


SECTION = "## LLaMA-Factory's example configs of these methods"
REPORT = REPO_ROOT / "docs" / "BENCHMARKS_methods.md"


def write_section(rows: list[dict]) -> None:
    """Replace this script's section of docs/BENCHMARKS_methods.md (methods_bench.py keeps it)."""
    lines = [
        SECTION,
        "",
        "`python bench/methods_examples.py --lf_repo <LLaMA-Factory v0.9.5 checkout>`: each example config unchanged but "
        "for model_name_or_path (a tiny 8-layer Llama; for LLaMA Pro the same grown by `lathe expand ... --num_expand 8`; "
        "for the pre-quantized examples a copy whose config.json declares that quantization), output_dir, max_steps: 4 "
        "and bf16: false. Both tools log no step loss with the examples' logging_steps (10), so the comparison is "
        "`train_loss` (all_results.json, the mean of the 4 steps; with warmup_ratio 0.1 the first step has rate 0, the next three train).",
        "",
        "| example | lathe | LLaMA-Factory | train_loss lathe | train_loss LLaMA-Factory | equal |",
        "|---|---|---|---:|---:|---|",
    ]
    for row in rows:
        ours, theirs = row.get("lathe_losses") or [None], row.get("llamafactory_losses") or [None]
        lines.append(
            f"| {row['example']} | {row['lathe']} | {row.get('llamafactory', '')} | "
            f"{'' if ours[-1] is None else repr(ours[-1])} | {'' if theirs[-1] is None else repr(theirs[-1])} | "
            f"{'yes' if row.get('equal') else ''} |"
        )
    text = REPORT.read_text() if REPORT.exists() else ""
    head = text.split(SECTION)[0].rstrip()
    section = "\n".join(lines).replace(str(REPO_ROOT) + "/", "")  # paths relative to the repository
    REPORT.write_text((head + "\n\n" if head else "") + section + "\n")


def main() -> None:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lf_repo", required=True, help="LLaMA-Factory checkout at v0.9.5")
    parser.add_argument("--only", nargs="*", help="these example paths (relative to examples/)")
    parser.add_argument("--no_llamafactory", action="store_true", help="run lathe only")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    repo = Path(args.lf_repo)
    models = {"base": WORK / "model", "pro": WORK / "model-pro"}
    build_model(models["base"])
    if not models["pro"].exists():
        from lathe.llm.model.llama_pro import expand_blocks

        expand_blocks(str(models["base"]), str(models["pro"]), 8)
    rows = []
    for example in args.only or EXAMPLES:
        config = yaml.safe_load((repo / "examples" / example).read_text())
        lathe_config = adapted(example, config, models, repo / "data", "lathe")
        code, stderr = run_lathe(lathe_config)
        row = {
            "example": example,
            "lathe": "ran" if code == 0 else f"refused (exit {code}): {last_line(stderr)}",
            "lathe_losses": logged_losses(lathe_config["output_dir"]) if code == 0 else [],
        }
        if not args.no_llamafactory:
            lf_config = adapted(example, config, models, repo / "data", "llamafactory")
            code, stderr = run_llamafactory(lf_config)
            row["llamafactory"] = "ran" if code == 0 else f"failed (exit {code}): {last_line(stderr)}"
            row["llamafactory_losses"] = logged_losses(lf_config["output_dir"]) if code == 0 else []
            # train_loss (the last value) must match; step losses only where both logged them
            row["equal"] = bool(row["lathe_losses"]) and row["lathe_losses"][-1:] == row["llamafactory_losses"][-1:]
        rows.append(row)
        print(json.dumps(row), flush=True)
    (WORK / "results.json").write_text(json.dumps(rows, indent=1))
    if not args.no_llamafactory and not args.only:
        write_section(rows)


if __name__ == "__main__":
    main()
