"""Regenerate the LLaMA-Factory step losses that tests/llm/test_methods.py compares `lathe train` against.

    python tests/llm/golden/make_llamafactory_methods.py [--python bench/.venv-lf/bin/python] [--only NAME,...]

Run with lathe's Python from the repository root. It builds the shared assets (a 2-layer Llama whose weights
are drawn from a seeded generator, the committed BPE tokenizer, a small alpaca dataset) into a temporary
folder, then runs this same file in LLaMA-Factory's environment (`--worker`, where lathe is not imported):
each case below is one `llamafactory.train.tuner.run_exp` (stage sft, full fine-tuning unless the case says
otherwise, fp32 on CPU), with a callback that records every log line. Writes
tests/llm/golden/llamafactory_methods.json: per case the config keys, the logged loss, grad_norm and
learning_rate of every step, and a fingerprint of the saved weights, with the versions that produced it.
LLaMA-Factory's venv needs the method packages: galore-torch, apollo-torch, badam, adam-mini.
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
GOLDEN = HERE / "llamafactory_methods.json"
TOKENIZER = HERE / "tokenizers" / "bpe"

# What every case shares: the keys a user would write, fp32 on CPU, a step logged at a time.
BASE = {
    "stage": "sft", "do_train": True, "finetuning_type": "full", "dataset": "arith", "template": "qwen",
    "cutoff_len": 48, "overwrite_cache": True, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
    "learning_rate": 1.0e-3, "lr_scheduler_type": "cosine", "warmup_steps": 0, "max_steps": 5, "logging_steps": 1,
    "save_strategy": "no", "report_to": "none", "overwrite_output_dir": True, "seed": 42, "use_cpu": True,
    "bf16": False, "disable_tqdm": True, "dataloader_num_workers": 0, "weight_decay": 0.01,
}
# LLaMA-Factory 0.9.5 builds GaLore / APOLLO only for optim adamw_torch (transformers 5 defaults to the fused
# name, for which it raises NotImplementedError): the cases say adamw_torch so that it runs. Its layer-wise
# variants never schedule the per-parameter learning rates under transformers 5 (the Trainer no longer passes
# the optimizer to create_scheduler, where LLaMA-Factory attaches them): those cases use a constant rate, on
# which both agree; tests/llm/test_methods.py checks lathe's scheduled layer-wise runs another way. BAdam's
# ratio mode passes `fused` to a class that does not take it unless optim is adamw_torch.
CASES = {
    "baseline": {},
    "galore": {"use_galore": True, "galore_rank": 4, "galore_update_interval": 2, "galore_scale": 2.0,
               "optim": "adamw_torch"},
    "galore_target": {"use_galore": True, "galore_target": "mlp", "galore_rank": 4, "galore_proj_type": "left",
                      "galore_update_interval": 3, "optim": "adamw_torch"},
    "galore_layerwise": {"use_galore": True, "galore_layerwise": True, "galore_rank": 4, "galore_update_interval": 2,
                         "gradient_accumulation_steps": 1, "optim": "adamw_torch", "lr_scheduler_type": "constant"},
    "apollo": {"use_apollo": True, "apollo_rank": 4, "apollo_update_interval": 2, "apollo_scale": 8.0,
               "optim": "adamw_torch"},
    "apollo_svd_tensor": {"use_apollo": True, "apollo_rank": 4, "apollo_proj": "svd", "apollo_scale_type": "tensor",
                          "apollo_update_interval": 2, "optim": "adamw_torch"},
    "apollo_layerwise": {"use_apollo": True, "apollo_layerwise": True, "apollo_rank": 4, "apollo_update_interval": 2,
                         "gradient_accumulation_steps": 1, "optim": "adamw_torch", "lr_scheduler_type": "constant"},
    "badam_layer": {"use_badam": True, "badam_mode": "layer", "badam_switch_mode": "ascending",
                    "badam_switch_interval": 2, "max_grad_norm": 0.5},
    "badam_descending": {"use_badam": True, "badam_mode": "layer", "badam_switch_mode": "descending",
                         "badam_switch_interval": 1, "badam_start_block": 1},
    "badam_ratio": {"use_badam": True, "badam_mode": "ratio", "badam_update_ratio": 0.25,
                    "badam_mask_mode": "adjacent", "optim": "adamw_torch"},
    "adam_mini": {"use_adam_mini": True},
    "muon": {"use_muon": True, "learning_rate": 2.0e-3},
    "dft": {"use_dft_loss": True},
    "eaft": {"use_eaft_loss": True, "eaft_alpha": 0.5},
    "asft": {"use_asft_loss": True, "asft_alpha": 0.2},
}


# ---- assets (built with lathe's environment; the tests build them the same way) --------------------------
def alpaca_rows(count: int = 24) -> list[dict]:
    """Arithmetic and word reversal, answers of varied length, seeded."""
    rng = random.Random(0)
    words = ["lathe", "model", "token", "reverse", "string", "brown", "quick", "fox"]
    rows = []
    for index in range(count):
        if index % 2:
            a, b = rng.randint(0, 20), rng.randint(0, 20)
            rows.append({"instruction": f"What is {a} plus {b}?", "input": "",
                         "output": f"{a} plus {b} is {a + b}." + " Yes." * rng.randint(0, 3)})
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
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=False)
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


def build_assets(folder: Path) -> tuple[str, str]:
    """(model folder, dataset folder) under `folder`."""
    model_dir, data_dir = folder / "model", folder / "data"
    if not (model_dir / "config.json").exists():
        model_dir.mkdir(parents=True, exist_ok=True)
        build_model(model_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "arith.json").write_text(json.dumps(alpaca_rows()), encoding="utf-8")
    (data_dir / "dataset_info.json").write_text(json.dumps({"arith": {"file_name": "arith.json"}}), encoding="utf-8")
    return str(model_dir), str(data_dir)


def case_config(name: str, model_dir: str, data_dir: str, output_dir: str) -> dict:
    return {"model_name_or_path": model_dir, "dataset_dir": data_dir, "output_dir": output_dir, **BASE, **CASES[name]}


# ---- the LLaMA-Factory side (runs in its environment) ----------------------------------------------------
def weights_fingerprint(folder: str) -> dict:
    """Sum and sum of squares of every saved tensor, in float64: equal weights give equal numbers."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, "model.safetensors"))
    return {name: [float(t.double().sum()), float(t.double().square().sum())] for name, t in sorted(tensors.items())}


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
        results[name] = {"config": CASES[name], "steps": recorder.logs, "weights": weights_fingerprint(output_dir)}
        print(f"{name}: {[round(line['loss'], 6) for line in recorder.logs]}", file=sys.stderr, flush=True)
    versions = {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__}
    for package in ("galore_torch", "apollo_torch", "badam", "adam_mini"):
        from importlib.metadata import PackageNotFoundError, version

        try:
            versions[package] = version(package.replace("_", "-"))
        except PackageNotFoundError:
            pass
    return {"versions": versions, "base": BASE, "cases": results}


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
    names = args.only.split(",") if args.only else list(CASES)
    with tempfile.TemporaryDirectory() as folder:
        model_dir, data_dir = build_assets(Path(folder))
        out = Path(folder) / "result.json"
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1",
                   PYTHONPATH=args.stubs, TRANSFORMERS_VERBOSITY="error", HOME=folder)
        subprocess.run([args.python, __file__, "--worker", ",".join(names), model_dir, data_dir, str(out)],
                       check=True, env=env, cwd=folder)
        result = json.loads(out.read_text(encoding="utf-8"))
        shutil.rmtree(Path(folder) / "model", ignore_errors=True)
    if args.only and GOLDEN.exists():
        previous = json.loads(GOLDEN.read_text(encoding="utf-8"))
        result["cases"] = {**previous["cases"], **result["cases"]}
    result["cases"] = {name: result["cases"][name] for name in CASES if name in result["cases"]}
    GOLDEN.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
