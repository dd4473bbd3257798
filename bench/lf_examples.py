"""LLaMA-Factory's own example configs (stage pt / sft) run by `lathe train` and by `llamafactory-cli train`.

    git clone --branch v0.9.5 --depth 1 https://github.com/hiyouga/LLaMA-Factory bench/.cache/LLaMA-Factory
    bench/setup_llamafactory.sh                     # once: bench/.venv-lf (LLaMA-Factory 0.9.5)
    python bench/lf_examples.py                     # ~45 min on 2 cores: prints the table
    python bench/lf_examples.py --report docs/LLAMAFACTORY_EXAMPLES.md --only galore,badam

The examples stay outside the repository (bench/.cache/, git-ignored). Each YAML file of stage pt or sft under
examples/ is run unchanged except for: model_name_or_path (a tiny local Llama, built once into
bench/.cache/examples/assets with a tokenizer that has every template's chat markers), adapter_name_or_path
(a seeded LoRA adapter for that model), output_dir, max_steps (2), logging_steps (1, so the first step is
logged), and fp32 on CPU (bf16 / fp16 / pure_bf16 off, use_cpu on). Both run from the LLaMA-Factory checkout,
so its relative dataset_dir (data/) and deepspeed paths resolve; with a deepspeed key LLaMA-Factory also gets
FORCE_TORCHRUN=1 (and NPROC_PER_NODE=1), which it requires. Per example it prints: whether each tool ran or refused (with its one
line), the loss of step 1 of each, and whether both tokenize the training data the same (every input_ids and
labels row, compared by hash, each tool's own pipeline; only where both ran).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CACHE = BENCH / ".cache"
WORK = CACHE / "examples"
ASSETS = WORK / "assets"
LF_PYTHON = BENCH / ".venv-lf" / "bin" / "python"
LF_STUBS = BENCH / "lf_stubs"
MAX_STEPS = 2

# Chat markers of the templates the examples name (llama3, qwen/qwen3, llama2, deepseek, deepseek3, ...): as
# special tokens of the tiny tokenizer, so no template has to add tokens the model has no rows for.
SPECIAL_TOKENS = [
    "<unk>",
    "<s>",
    "</s>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "[INST]",
    "[/INST]",
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
]
ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


# ------------------------------------------------------------------------------------------ assets
def build_assets(lf_root: Path) -> tuple[str, str]:
    """(tiny model folder, LoRA adapter folder), built once: a byte-level BPE trained on LLaMA-Factory's demo
    data, an 8-layer Llama (hidden 64) with seeded weights, and a rank-8 adapter on q_proj / v_proj."""
    model_dir, adapter_dir = ASSETS / "model", ASSETS / "adapter"
    if (adapter_dir / "adapter_config.json").exists():
        return str(model_dir), str(adapter_dir)
    import torch
    from peft import LoraConfig, get_peft_model
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = []
    for name in ("alpaca_en_demo.json", "identity.json", "alpaca_zh_demo.json"):
        for row in json.loads((lf_root / "data" / name).read_text(encoding="utf-8")):
            texts.extend(str(value) for value in row.values() if isinstance(value, str))
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=3000, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    backend.add_tokens([AddedToken(token, normalized=False) for token in ADDED_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(
                torch.ones_like(parameter)
                if name.endswith("norm.weight")
                else torch.randn(parameter.shape, generator=generator) * 0.02
            )
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    peft_model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    peft_model.save_pretrained(str(adapter_dir))
    return str(model_dir), str(adapter_dir)


# ------------------------------------------------------------------------------------------ configs
def examples(lf_root: Path, only: list[str] | None) -> list[Path]:
    import yaml

    chosen = []
    for path in sorted(glob.glob(str(lf_root / "examples" / "**" / "*.yaml"), recursive=True)):
        values = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if isinstance(values, dict) and values.get("stage") in ("pt", "sft"):
            name = str(Path(path).relative_to(lf_root / "examples"))
            if not only or any(part in name for part in only):
                chosen.append(Path(path))
    return chosen


def changed_config(path: Path, tool: str, model_dir: str, adapter_dir: str) -> dict:
    """The example with only the model path, adapter path, output_dir, max_steps, logging_steps and fp32 on
    CPU changed."""
    import yaml

    values = yaml.safe_load(path.read_text(encoding="utf-8"))
    values["model_name_or_path"] = model_dir
    if values.get("adapter_name_or_path"):
        values["adapter_name_or_path"] = adapter_dir
    values["output_dir"] = str(WORK / "runs" / tool / example_name(path))
    values["max_steps"] = MAX_STEPS
    values["logging_steps"] = 1
    for key in ("bf16", "fp16", "pure_bf16"):
        if values.get(key):
            values[key] = False
    values["use_cpu"] = True
    return values


def example_name(path: Path) -> str:
    return str(path).split("/examples/", 1)[1].removesuffix(".yaml")


# ------------------------------------------------------------------------------------------ running
def environment(tool: str, config: dict) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        DISABLE_VERSION_CHECK="1",
        HOME=str(CACHE / f"home-{tool}"),
        MPLCONFIGDIR=str(CACHE / "mplconfig"),
    )
    if tool == "lathe":
        env["PYTHONPATH"] = str(REPO)
    else:
        env["PYTHONPATH"] = str(LF_STUBS)
        env["PATH"] = f"{LF_PYTHON.parent}{os.pathsep}{env.get('PATH', '')}"  # its launcher calls `torchrun`
        if config.get("deepspeed"):  # LLaMA-Factory runs DeepSpeed under its torchrun launcher only
            env.update(FORCE_TORCHRUN="1", NPROC_PER_NODE="1")  # one process: it counts no GPU here
    return env


def run_training(tool: str, config: dict, lf_root: Path, timeout: int) -> dict:
    """One `train` run: ran (with the step-1 loss or the predict scores) or refused (with its one line)."""
    import shutil

    import yaml

    output = Path(config["output_dir"])
    shutil.rmtree(output, ignore_errors=True)
    config_path = WORK / "configs" / tool / f"{output.name}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    command = (
        [sys.executable, "-m", "lathe", "train", str(config_path)]
        if tool == "lathe"
        else [str(LF_PYTHON.parent / "llamafactory-cli"), "train", str(config_path)]
    )
    start = time.time()
    try:
        done = subprocess.run(
            command, cwd=lf_root, env=environment(tool, config), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"ran": False, "line": f"timed out after {timeout} s", "seconds": timeout}
    result = {"seconds": round(time.time() - start, 1)}
    if done.returncode != 0:
        return {**result, "ran": False, "exit": done.returncode, "line": refusal_line(tool, done.stderr + done.stdout)}
    return {**result, "ran": True, **outcome(output)}


def refusal_line(tool: str, text: str) -> str:
    if tool == "lathe":
        for line in text.splitlines():
            if line.startswith("lathe train: error: "):
                return line.removeprefix("lathe train: error: ")
    # The worker's own error, not the launcher's report that a worker failed (torchrun prefixes "[rank0]: ").
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", line).strip() for line in text.splitlines()]
    errors = [
        line
        for line in lines
        if re.match(r"^[\w.]*(Error|Exception|Exit)\b[:(]", line)
        and not re.match(r"^(subprocess\.CalledProcessError|torch\.distributed\.elastic\S*ChildFailedError)", line)
    ]
    return (errors[-1] if errors else (text.strip().splitlines() or ["(no output)"])[-1])[:300]


def outcome(output: Path) -> dict:
    """Step 1's loss from trainer_log.jsonl, or the prediction scores of a predict-only run."""
    log = output / "trainer_log.jsonl"
    if log.exists():
        losses = [
            entry["loss"] for entry in map(json.loads, log.read_text(encoding="utf-8").splitlines()) if "loss" in entry
        ]
        if losses:
            return {"step1_loss": losses[0], "losses": losses}
    predict = output / "predict_results.json"
    if predict.exists():
        scores = json.loads(predict.read_text(encoding="utf-8"))
        predictions = output / "generated_predictions.jsonl"
        digest = hashlib.sha256(predictions.read_bytes()).hexdigest()[:12] if predictions.exists() else None
        return {
            "predict": {key: value for key, value in scores.items() if re.search(r"bleu|rouge", key)},
            "predictions_sha": digest,
        }
    return {}


# ------------------------------------------------------------------------------------------ tokenization
LATHE_TOKENS = """
import hashlib, json, sys
from lathe.llm.config.train import parse_train_config
from lathe.llm.data.pipeline import get_dataset
from lathe.llm.model.loader import load_tokenizer
from lathe.llm.templates import get_template_and_fix_tokenizer
config = parse_train_config(json.loads(sys.argv[1]))
tokenizer = load_tokenizer(config.model)
template = get_template_and_fix_tokenizer(tokenizer, config.data)
datasets = get_dataset(template, config.model, config.data, config.training, stage=config.finetuning.stage, tokenizer=tokenizer)
"""
LF_TOKENS = """
import hashlib, json, sys
from llamafactory.hparams import get_train_args
from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
from llamafactory.model import load_tokenizer
model_args, data_args, training_args, finetuning_args, _ = get_train_args(json.loads(sys.argv[1]))
module = load_tokenizer(model_args)
template = get_template_and_fix_tokenizer(module["tokenizer"], data_args)
datasets = get_dataset(template, model_args, data_args, training_args, stage=finetuning_args.stage, **module)
"""
DIGEST = """
split = datasets["train_dataset"] if datasets.get("train_dataset") is not None else datasets["eval_dataset"]
labels = split["labels"] if "labels" in split.column_names else [[] for _ in range(len(split))]  # pt: none
rows = [[list(map(int, ids)), list(map(int, row))] for ids, row in zip(split["input_ids"], labels)]
print("DIGEST", json.dumps({"rows": len(rows), "tokens": sum(len(r[0]) for r in rows),
      "sha": hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]}))
"""


def tokenization(tool: str, config: dict, lf_root: Path, timeout: int) -> dict | None:
    """Rows, tokens and a hash of every (input_ids, labels) row of the training split, from the tool's own pipeline."""
    values = {key: value for key, value in config.items() if key not in ("deepspeed",)}  # no launcher needed here
    values["output_dir"] = str(WORK / "tokens" / tool)
    script = (LATHE_TOKENS if tool == "lathe" else LF_TOKENS) + DIGEST
    python = sys.executable if tool == "lathe" else str(LF_PYTHON)
    try:
        done = subprocess.run(
            [python, "-c", script, json.dumps(values)],
            cwd=lf_root,
            env=environment(tool, {}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    for line in done.stdout.splitlines():
        if line.startswith("DIGEST "):
            return json.loads(line.removeprefix("DIGEST "))
    return None


# ------------------------------------------------------------------------------------------ report
def run_example(path: Path, lf_root: Path, assets: tuple[str, str], timeout: int, earlier: dict | None = None) -> dict:
    """`earlier`: LLaMA-Factory's training result from the last results.json, reused instead of a rerun
    (--lathe-only: after a lathe change LLaMA-Factory's run is the same; tokenization is still compared)."""
    record = {"example": example_name(path)}
    for tool in ("lathe", "llamafactory"):
        if tool == "llamafactory" and earlier is not None:
            record[tool] = earlier
            continue
        record[tool] = run_training(tool, changed_config(path, tool, *assets), lf_root, timeout)
    if record["lathe"]["ran"] and record["llamafactory"]["ran"]:
        ours = tokenization("lathe", changed_config(path, "lathe", *assets), lf_root, timeout)
        theirs = tokenization("llamafactory", changed_config(path, "llamafactory", *assets), lf_root, timeout)
        record["tokens"] = {"lathe": ours, "llamafactory": theirs}
    return record


def cell(result: dict) -> str:
    if not result["ran"]:
        line = re.sub(r" \(in [^)]*\.yaml\)", "", result["line"])  # the config's path: ours, not the example's
        return f"refused: {line[:220] + ' ...' if len(line) > 220 else line}"
    if "step1_loss" in result:
        later = "".join(f", step {step} {loss:.6f}" for step, loss in enumerate(result["losses"][1:], start=2))
        return f"ran, step-1 loss {result['step1_loss']:.6f}{later}"
    if "predict" in result:
        scores = ", ".join(
            f"{key.removeprefix('predict_')} {value:.4f}" for key, value in sorted(result["predict"].items())
        )
        return f"ran (predict): {scores}; generated_predictions.jsonl sha256 {result['predictions_sha']}"
    return "ran"


def tokens_cell(record: dict) -> str:
    tokens = record.get("tokens")
    if not tokens:
        return "-"
    ours, theirs = tokens["lathe"], tokens["llamafactory"]
    if ours is None or theirs is None:
        return "not compared (a tokenization pass failed)"
    if ours["sha"] == theirs["sha"]:
        return f"equal ({ours['rows']} rows, {ours['tokens']} tokens)"
    return f"differ: lathe {ours['rows']} rows / {ours['tokens']} tokens, LLaMA-Factory {theirs['rows']} / {theirs['tokens']}"


def render(records: list[dict]) -> str:
    lines = ["| example | lathe | LLaMA-Factory | tokenization |", "|---|---|---|---|"]
    for record in records:
        row = [record["example"], cell(record["lathe"]), cell(record["llamafactory"]), tokens_cell(record)]
        lines.append("| " + " | ".join(text.replace("|", "\\|") for text in row) + " |")
    ran = {tool: sum(record[tool]["ran"] for record in records) for tool in ("lathe", "llamafactory")}
    both = [record for record in records if record["lathe"].get("losses") and record["llamafactory"].get("losses")]
    same_first = sum(record["lathe"]["step1_loss"] == record["llamafactory"]["step1_loss"] for record in both)
    same_all = sum(record["lathe"]["losses"] == record["llamafactory"]["losses"] for record in both)
    lines += [
        "",
        f"{len(records)} examples: lathe ran {ran['lathe']}, LLaMA-Factory ran {ran['llamafactory']}. Where both "
        f"trained ({len(both)}): the same step-1 loss, bit for bit, in {same_first}; the same loss at every "
        f"logged step in {same_all}.",
    ]
    return "\n".join(lines)


def main() -> int:
    global LF_PYTHON, LF_STUBS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lf-root", default=str(CACHE / "LLaMA-Factory"), help="a LLaMA-Factory v0.9.5 checkout")
    parser.add_argument("--lf-python", default=str(LF_PYTHON), help="Python of the LLaMA-Factory venv")
    parser.add_argument("--lf-stubs", default=str(LF_STUBS), help="the torchaudio stand-in setup_llamafactory.sh makes")
    parser.add_argument("--only", help="comma-separated substrings of example paths")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--report", help="also write the table (markdown) into this file, between the markers")
    parser.add_argument(
        "--lathe-only",
        action="store_true",
        help="rerun lathe only; take LLaMA-Factory's training results from the last results.json",
    )
    parser.add_argument("--from-results", action="store_true", help="run nothing: render the last results.json")
    args = parser.parse_args()
    if args.from_results:
        table = render(json.loads((WORK / "results.json").read_text(encoding="utf-8")))
        print(table)
        if args.report:
            write_report(Path(args.report), table)
        return 0
    LF_PYTHON, LF_STUBS = Path(args.lf_python), Path(args.lf_stubs)
    lf_root = Path(args.lf_root).resolve()
    if not (lf_root / "examples").is_dir():
        print(f"No LLaMA-Factory checkout at {lf_root}: {__doc__.splitlines()[2].strip()}", file=sys.stderr)
        return 2
    assets = build_assets(lf_root)
    results_file = WORK / "results.json"
    previous = {}
    if args.lathe_only and results_file.exists():
        previous = {record["example"]: record for record in json.loads(results_file.read_text(encoding="utf-8"))}
    records = []
    for path in examples(lf_root, args.only.split(",") if args.only else None):
        earlier = previous.get(example_name(path), {}).get("llamafactory") if args.lathe_only else None
        record = run_example(path, lf_root, assets, args.timeout, earlier)
        records.append(record)
        print(
            f"{record['example']}\n  lathe:         {cell(record['lathe'])}\n  LLaMA-Factory: {cell(record['llamafactory'])}\n"
            f"  tokenization:  {tokens_cell(record)}",
            flush=True,
        )
    results = WORK / "results.json"
    if args.only and results.exists():  # a partial run updates those examples in the last full run's results
        fresh = {record["example"]: record for record in records}
        records = [fresh.pop(record["example"], record) for record in json.loads(results.read_text(encoding="utf-8"))]
        records += list(fresh.values())
    results.write_text(json.dumps(records, indent=1), encoding="utf-8")
    table = render(records)
    print("\n" + table)
    if args.report:
        write_report(Path(args.report), table)
    return 0


def write_report(path: Path, table: str) -> None:
    begin, end = "<!-- lf_examples:begin -->", "<!-- lf_examples:end -->"
    text = path.read_text(encoding="utf-8") if path.exists() else f"{begin}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{begin}\n{table}\n{end}{tail}", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
