"""Regenerate the LLaMA-Factory step losses that tests/llm/test_optim_methods.py compares `lathe train` against.

    python tests/llm/golden/make_llamafactory_optim.py [--python bench/.venv-lf/bin/python] [--only NAME,...]

Run with lathe's Python from the repository root. It builds the shared assets (a 2-layer Llama whose weights
are drawn from a seeded generator, the committed BPE tokenizer, a small alpaca dataset) into a temporary
folder, then runs this same file in LLaMA-Factory's environment (`--worker`, where lathe is not imported):
each case below is one `llamafactory.train.tuner.run_exp` (stage sft, full fine-tuning unless the case says
otherwise, fp32 on CPU), with a callback that records every log line. Writes
tests/llm/golden/llamafactory_optim.json: per training case the config keys, the logged loss, grad_norm and
learning_rate of every step, and a fingerprint of the saved weights; per prediction case (a LoRA adapter,
no do_train) the BLEU-4 / ROUGE scores and generated_predictions.jsonl; with the versions that produced it.
LLaMA-Factory's venv needs the method packages: galore-torch, apollo-torch, badam, adam-mini, jieba, nltk,
rouge-chinese.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_optim.json"
TOKENIZER = HERE / "tokenizers" / "bpe"

# What every case shares: the keys a user would write, fp32 on CPU, a step logged at a time.
BASE = {
    "stage": "sft",
    "do_train": True,
    "finetuning_type": "full",
    "dataset": "arith",
    "template": "qwen",
    "cutoff_len": 48,
    "overwrite_cache": True,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "learning_rate": 1.0e-3,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0,
    "max_steps": 5,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "overwrite_output_dir": True,
    "seed": 42,
    "use_cpu": True,
    "bf16": False,
    "disable_tqdm": True,
    "dataloader_num_workers": 0,
    "weight_decay": 0.01,
}
# LLaMA-Factory 0.9.5 builds GaLore / APOLLO only for optim adamw_torch (transformers 5 defaults to the fused
# name, for which it raises NotImplementedError): the cases say adamw_torch so that it runs. Its layer-wise
# variants never schedule the per-parameter learning rates under transformers 5 (the Trainer no longer passes
# the optimizer to create_scheduler, where LLaMA-Factory attaches them): those cases use a constant rate, on
# which both agree; tests/llm/test_optim_methods.py checks lathe's scheduled layer-wise runs another way. BAdam's
# ratio mode passes `fused` to a class that does not take it unless optim is adamw_torch.
CASES = {
    "baseline": {},
    "galore": {
        "use_galore": True,
        "galore_rank": 4,
        "galore_update_interval": 2,
        "galore_scale": 2.0,
        "optim": "adamw_torch",
    },
    "galore_target": {
        "use_galore": True,
        "galore_target": "mlp",
        "galore_rank": 4,
        "galore_proj_type": "left",
        "galore_update_interval": 3,
        "optim": "adamw_torch",
    },
    "galore_layerwise": {
        "use_galore": True,
        "galore_layerwise": True,
        "galore_rank": 4,
        "galore_update_interval": 2,
        "gradient_accumulation_steps": 1,
        "optim": "adamw_torch",
        "lr_scheduler_type": "constant",
    },
    "apollo": {
        "use_apollo": True,
        "apollo_rank": 4,
        "apollo_update_interval": 2,
        "apollo_scale": 8.0,
        "optim": "adamw_torch",
    },
    "apollo_svd_tensor": {
        "use_apollo": True,
        "apollo_rank": 4,
        "apollo_proj": "svd",
        "apollo_scale_type": "tensor",
        "apollo_update_interval": 2,
        "optim": "adamw_torch",
    },
    "apollo_layerwise": {
        "use_apollo": True,
        "apollo_layerwise": True,
        "apollo_rank": 4,
        "apollo_update_interval": 2,
        "gradient_accumulation_steps": 1,
        "optim": "adamw_torch",
        "lr_scheduler_type": "constant",
    },
    "badam_layer": {
        "use_badam": True,
        "badam_mode": "layer",
        "badam_switch_mode": "ascending",
        "badam_switch_interval": 2,
        "max_grad_norm": 0.5,
    },
    "badam_descending": {
        "use_badam": True,
        "badam_mode": "layer",
        "badam_switch_mode": "descending",
        "badam_switch_interval": 1,
        "badam_start_block": 1,
    },
    "badam_ratio": {
        "use_badam": True,
        "badam_mode": "ratio",
        "badam_update_ratio": 0.25,
        "badam_mask_mode": "adjacent",
        "optim": "adamw_torch",
    },
    "adam_mini": {"use_adam_mini": True},
    "muon": {"use_muon": True, "learning_rate": 2.0e-3},
    "dft": {"use_dft_loss": True},
    "eaft": {"use_eaft_loss": True, "eaft_alpha": 0.5},
    "asft": {"use_asft_loss": True, "asft_alpha": 0.2},
}

# Prediction only (LLaMA-Factory's examples/extras/nlg_eval): no do_train, a LoRA adapter, generation on the
# eval set, generated_predictions.jsonl and BLEU-4 / ROUGE. Greedy, and sampled with the default settings.
PREDICT_BASE = {
    "stage": "sft",
    "do_predict": True,
    "finetuning_type": "lora",
    "eval_dataset": "arith",
    "template": "qwen",
    "cutoff_len": 128,
    "max_samples": 10,
    "overwrite_cache": True,
    "per_device_eval_batch_size": 2,
    "predict_with_generate": True,
    "overwrite_output_dir": True,
    "report_to": "none",
    "use_cpu": True,
    "bf16": False,
    "disable_tqdm": True,
    "max_new_tokens": 12,
    "seed": 42,
}
PREDICT_CASES = {
    "predict_greedy": {"do_sample": False},
    "predict_sampled": {"per_device_eval_batch_size": 1},
}

# LLaMA-Factory's ComputeSimilarity on fixed (prediction, reference) texts, encoded with the committed tokenizer:
# English and Chinese (jieba's words), partial overlap, an empty prediction, identical texts.
SIMILARITY_PAIRS = [
    ("the quick brown fox jumps over the lazy dog", "the quick brown fox jumped over a lazy dog"),
    ("13 plus 1 is 14.", "13 plus 1 is 14. Yes."),
    ("今天天气很好，我们去公园散步吧", "今天天气不错，我们去公园走走"),
    ("", "something to say"),
    ("reverse the string: olleh", "reverse the string: olleh"),
    ("机器学习是人工智能的一个分支", "深度学习是机器学习的一个分支"),
]


# ---- assets (built with lathe's environment; the tests build them the same way) --------------------------
def alpaca_rows(count: int = 24) -> list[dict]:
    """Arithmetic and word reversal, answers of varied length, seeded."""
    rng = random.Random(0)
    words = ["lathe", "model", "token", "reverse", "string", "brown", "quick", "fox"]
    rows = []
    for index in range(count):
        if index % 2:
            a, b = rng.randint(0, 20), rng.randint(0, 20)
            rows.append(
                {
                    "instruction": f"What is {a} plus {b}?",
                    "input": "",
                    "output": f"{a} plus {b} is {a + b}." + " Yes." * rng.randint(0, 3),
                }
            )
        else:
            word = rng.choice(words)
            rows.append({"instruction": "Reverse the string.", "input": word, "output": word[::-1]})
    return rows


def build_model(folder: Path) -> None:
    """A 2-layer Llama (GQA 4/2 heads) with weights drawn from one seeded generator in parameter order, so
    the file does not depend on how a transformers version initialises; plus the committed tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


def build_adapter(model_dir: Path, folder: Path) -> None:
    """A LoRA adapter (rank 4 on q_proj and v_proj) with seeded weights, B non-zero so it changes the model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(model_dir)),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    model.save_pretrained(str(folder))


def build_assets(folder: Path) -> tuple[str, str]:
    """(model folder, dataset folder) under `folder`; the LoRA adapter is `folder`/adapter."""
    model_dir, data_dir = folder / "model", folder / "data"
    if not (model_dir / "config.json").exists():
        model_dir.mkdir(parents=True, exist_ok=True)
        build_model(model_dir)
        build_adapter(model_dir, folder / "adapter")
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "arith.json").write_text(json.dumps(alpaca_rows()), encoding="utf-8")
    (data_dir / "dataset_info.json").write_text(json.dumps({"arith": {"file_name": "arith.json"}}), encoding="utf-8")
    return str(model_dir), str(data_dir)


def case_config(name: str, model_dir: str, data_dir: str, output_dir: str) -> dict:
    if name in PREDICT_CASES:
        adapter = str(Path(model_dir).parent / "adapter")
        return {
            "model_name_or_path": model_dir,
            "adapter_name_or_path": adapter,
            "dataset_dir": data_dir,
            "output_dir": output_dir,
            **PREDICT_BASE,
            **PREDICT_CASES[name],
        }
    return {"model_name_or_path": model_dir, "dataset_dir": data_dir, "output_dir": output_dir, **BASE, **CASES[name]}


# ---- the LLaMA-Factory side (runs in its environment) ----------------------------------------------------
def weights_fingerprint(folder: str) -> dict:
    """Sum and sum of squares of every saved tensor, in float64: equal weights give equal numbers."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, "model.safetensors"))
    return {name: [float(t.double().sum()), float(t.double().square().sum())] for name, t in sorted(tensors.items())}


def prediction_outputs(folder: str) -> dict:
    """predict_results.json's scores (not its timings) and generated_predictions.jsonl's lines."""
    with open(os.path.join(folder, "predict_results.json"), encoding="utf-8") as f:
        metrics = {key: value for key, value in json.load(f).items() if key.split("_", 1)[1] in SCORES}
    with open(os.path.join(folder, "generated_predictions.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    return {"metrics": metrics, "predictions": lines}


SCORES = ("bleu-4", "rouge-1", "rouge-2", "rouge-l")


def encoded_pairs(tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """SIMILARITY_PAIRS as token rows padded with -100 to one length (as prediction loops return them)."""
    rows = [[tokenizer.encode(text, add_special_tokens=False) for text in pair] for pair in SIMILARITY_PAIRS]
    width = max(len(row) for pair in rows for row in pair)
    padded = [[row + [-100] * (width - len(row)) for row in pair] for pair in rows]
    return [pair[0] for pair in padded], [pair[1] for pair in padded]


def similarity_with_llamafactory() -> dict:
    import numpy as np
    from llamafactory.train.sft.metric import ComputeSimilarity
    from transformers import AutoTokenizer, EvalPrediction

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    tokenizer.pad_token = tokenizer.eos_token  # as LLaMA-Factory's template fix leaves it
    predictions, labels = encoded_pairs(tokenizer)
    scores = ComputeSimilarity(tokenizer=tokenizer)(EvalPrediction(np.array(predictions), np.array(labels)))
    return {"pairs": SIMILARITY_PAIRS, "scores": scores}


def run_llamafactory(names: list[str], model_dir: str, data_dir: str, scratch: str) -> dict:
    import llamafactory
    import transformers
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.logs.append({key: logs[key] for key in ("loss", "grad_norm", "learning_rate") if key in logs})

    results = {}
    for name in names:
        output_dir = os.path.join(scratch, name)
        recorder = Recorder()
        run_exp(args=case_config(name, model_dir, data_dir, output_dir), callbacks=[recorder])
        if name in PREDICT_CASES:
            results[name] = {"config": PREDICT_CASES[name], **prediction_outputs(output_dir)}
            print(f"{name}: {results[name]['metrics']}", file=sys.stderr, flush=True)
            continue
        results[name] = {"config": CASES[name], "steps": recorder.logs, "weights": weights_fingerprint(output_dir)}
        print(f"{name}: {[round(line['loss'], 6) for line in recorder.logs]}", file=sys.stderr, flush=True)
    results["similarity"] = similarity_with_llamafactory()
    versions = {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__}
    from importlib.metadata import PackageNotFoundError, version

    for package in ("galore_torch", "apollo_torch", "badam", "adam_mini"):
        try:
            versions[package] = version(package.replace("_", "-"))
        except PackageNotFoundError:
            pass
    for package in ("jieba", "nltk", "rouge-chinese"):
        versions[package] = version(package)
    return {"versions": versions, "base": BASE, "predict_base": PREDICT_BASE, "cases": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(HERE.parents[2] / "bench/.venv-lf/bin/python"))
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="LLaMA-Factory's stand-ins")
    parser.add_argument("--only", help="comma-separated case names: regenerate these, keep the rest")
    parser.add_argument("--worker", nargs=4, metavar=("NAMES", "MODEL", "DATA", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        names, model_dir, data_dir, out = args.worker
        with tempfile.TemporaryDirectory() as scratch:
            result = run_llamafactory(names.split(","), model_dir, data_dir, scratch)
        Path(out).write_text(json.dumps(result), encoding="utf-8")
        return
    names = args.only.split(",") if args.only else [*CASES, *PREDICT_CASES]
    with tempfile.TemporaryDirectory() as folder:
        model_dir, data_dir = build_assets(Path(folder))
        out = Path(folder) / "result.json"
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            OMP_NUM_THREADS="1",
            PYTHONPATH=args.stubs,
            TRANSFORMERS_VERBOSITY="error",
            HOME=folder,
        )
        subprocess.run(
            [args.python, __file__, "--worker", ",".join(names), model_dir, data_dir, str(out)],
            check=True,
            env=env,
            cwd=folder,
        )
        result = json.loads(out.read_text(encoding="utf-8"))
        shutil.rmtree(Path(folder) / "model", ignore_errors=True)
    if args.only and GOLDEN.exists():
        previous = json.loads(GOLDEN.read_text(encoding="utf-8"))
        result["cases"] = {**previous["cases"], **result["cases"]}
    order = [*CASES, *PREDICT_CASES, "similarity"]
    result["cases"] = {name: result["cases"][name] for name in order if name in result["cases"]}
    GOLDEN.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
