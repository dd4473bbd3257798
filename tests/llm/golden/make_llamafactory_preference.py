"""Regenerate the LLaMA-Factory preference-training goldens that tests/llm/test_preference_golden.py
compares lathe against: tokenized pairs / KTO rows, and the first steps' losses and metrics of stages
dpo (sigmoid, orpo, simpo, BCO, LD-DPO, label smoothing, pref_ftx, ref_model), kto and rm.

    python tests/llm/golden/make_llamafactory_preference.py [--python bench/.venv-lf/bin/python]

Run with lathe's Python from the repository root. It builds the tiny models (build_model below: fixed
weights drawn from a seeded torch.Generator, so they do not depend on transformers' initialisation) next
to the committed BPE tokenizer, then runs this same file in LLaMA-Factory's environment (`--worker`,
where lathe is not imported): LLaMA-Factory 0.9.5's get_dataset tokenizes the preference data in
tests/llm/preference_data, and `run_exp` trains each case for a few steps on the CPU. Writes
tests/llm/golden/llamafactory_preference.json with the versions that produced it.

Not generated here: pref_loss hinge and ipo, which LLaMA-Factory 0.9.5 silently trains as sigmoid (its
DPO trainer never passes the loss type to TRL); the test checks lathe's hinge and ipo against a plain
PyTorch statement of those losses instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_preference.json"
TOKENIZER = HERE / "tokenizers" / "bpe"
DATA_DIR = HERE.parent / "preference_data"

# Every case: these keys, then its own. Identical for both sides (the test adds only output_dir).
BASE = {
    "template": "chatml",
    "dataset_dir": str(DATA_DIR),
    "cutoff_len": 64,
    "do_train": True,
    "max_steps": 3,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "learning_rate": 5.0e-3,
    "lr_scheduler_type": "constant",
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "seed": 42,
    "bf16": False,
    "overwrite_output_dir": True,
    "overwrite_cache": True,
    "disable_tqdm": True,
    "dataloader_num_workers": 0,
    "finetuning_type": "lora",
    "lora_rank": 4,
    "lora_target": "all",
}
PAIRS = {"dataset": "pairs_alpaca,pairs_sharegpt"}
CASES = {
    "dpo_sigmoid_lora": {"stage": "dpo", **PAIRS, "pref_beta": 0.1},
    "dpo_sigmoid_full_smoothing_ftx": {
        "stage": "dpo",
        **PAIRS,
        "finetuning_type": "full",
        "learning_rate": 1.0e-3,
        "dpo_label_smoothing": 0.1,
        "pref_ftx": 0.5,
    },
    "dpo_orpo_lora": {"stage": "dpo", **PAIRS, "pref_loss": "orpo", "pref_beta": 0.2},
    "dpo_simpo_freeze": {
        "stage": "dpo",
        **PAIRS,
        "pref_loss": "simpo",
        "simpo_gamma": 0.3,
        "pref_beta": 2.0,
        "finetuning_type": "freeze",
        "freeze_trainable_layers": 1,
        "learning_rate": 1.0e-3,
    },
    "dpo_bco_ld_lora": {"stage": "dpo", **PAIRS, "pref_bco_weight": 0.5, "ld_alpha": 0.5},
    "dpo_ref_model_lora_accumulation": {
        "stage": "dpo",
        **PAIRS,
        "ref_model": "{model_b}",
        "gradient_accumulation_steps": 2,
        "logging_steps": 2,
        "max_steps": 4,
    },
    "dpo_eval": {
        "stage": "dpo",
        **PAIRS,
        "val_size": 4,
        "do_eval": True,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "per_device_eval_batch_size": 2,
    },
    "kto_lora": {
        "stage": "kto",
        "dataset": "feedback",
        "kto_rejected_weight": 1.5,
        "per_device_train_batch_size": 4,
        "preprocessing_batch_size": 5,
    },
    "kto_full_eval_accumulation_ftx": {
        "stage": "kto",
        "dataset": "feedback",
        "finetuning_type": "full",
        "pref_ftx": 0.2,
        "learning_rate": 1.0e-3,
        "gradient_accumulation_steps": 2,
        "logging_steps": 2,
        "max_steps": 4,
        "val_size": 3,
        "do_eval": True,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "per_device_eval_batch_size": 3,
    },
    # Evaluated at the last step, then at every second step: the value head's dropout draws from the RNG,
    # which evaluation moves (its dataloader draws a seed), in transformers' Trainer and in lathe's alike.
    "rm_lora_eval": {
        "stage": "rm",
        **PAIRS,
        "learning_rate": 1.0e-2,
        "val_size": 4,
        "do_eval": True,
        "eval_strategy": "steps",
        "eval_steps": 3,
        "per_device_eval_batch_size": 2,
    },
    "rm_full": {"stage": "rm", **PAIRS, "finetuning_type": "full", "learning_rate": 1.0e-3},
    "rm_lora_eval_steps_2": {
        "stage": "rm",
        **PAIRS,
        "learning_rate": 1.0e-2,
        "val_size": 4,
        "do_eval": True,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "per_device_eval_batch_size": 2,
    },
}
# Tokenization only: the ids of every row (truncation, the KL pairing across preprocessing batches).
TOKENIZED = {
    "pairs": {"stage": "rm", **PAIRS, "cutoff_len": 64},
    "pairs_truncated": {"stage": "rm", **PAIRS, "cutoff_len": 14},
    "feedback": {"stage": "kto", "dataset": "feedback", "cutoff_len": 64, "preprocessing_batch_size": 5},
    "feedback_truncated": {"stage": "kto", "dataset": "feedback", "cutoff_len": 12},
}


# ---- the tiny models (lathe's environment) ------------------------------------------------------------
def build_model(folder: str | Path, seed: int = 0, tie_word_embeddings: bool = False) -> None:
    """A 2-layer Llama (hidden 16) over the committed BPE tokenizer, with weights drawn from a seeded
    torch.Generator (norm weights 1): the same numbers whatever transformers' own initialisation does."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for item in TOKENIZER.iterdir():
        shutil.copy(item, folder / item.name)
    config = LlamaConfig(
        vocab_size=len(AutoTokenizer.from_pretrained(str(TOKENIZER))),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=tie_word_embeddings,
    )
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    model.save_pretrained(str(folder))


def case_config(case: dict, model: str, model_b: str) -> dict:
    config = {**BASE, "model_name_or_path": model, **case}
    return {key: (value.format(model_b=model_b) if isinstance(value, str) else value) for key, value in config.items()}


# ---- the LLaMA-Factory side (its environment) ------------------------------------------------------------
def tokenize_with_llamafactory(config: dict) -> dict:
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    model_args, data_args, training_args, _, _ = get_train_args(config)
    module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(module["tokenizer"], data_args)
    dataset = get_dataset(template, model_args, data_args, training_args, stage=config["stage"], **module)[
        "train_dataset"
    ]
    keep = [name for name in dataset.column_names if name not in ("images", "videos", "audios")]
    return {name: list(dataset[name]) for name in keep}


def train_with_llamafactory(config: dict) -> list[dict]:
    from llamafactory.train.tuner import run_exp

    run_exp(config)
    with open(os.path.join(config["output_dir"], "trainer_state.json"), encoding="utf-8") as handle:
        return json.load(handle)["log_history"]


def patch_trl_availability_flags() -> None:
    """TRL 0.24 reads transformers' `_is_package_available(name)` as a bool; under transformers 5.6 it is a
    (found, version) tuple, always true, so `import trl.trainer.dpo_trainer` tries to import mergekit and
    fails. Keep the first element (the venv itself is left as it is)."""
    import trl.import_utils as flags

    for name in dir(flags):
        if name.startswith("_") and name.endswith("_available") and isinstance(getattr(flags, name), tuple):
            setattr(flags, name, getattr(flags, name)[0])


def run_worker(paths: dict) -> dict:
    import llamafactory
    import transformers
    import trl

    patch_trl_availability_flags()
    results = {
        "versions": {
            "llamafactory": llamafactory.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "tokenized": {},
        "runs": {},
    }
    for name, case in TOKENIZED.items():
        config = case_config(case, paths["model"], paths["model_b"])
        config["output_dir"] = os.path.join(paths["work"], f"tokenize_{name}")
        results["tokenized"][name] = tokenize_with_llamafactory(config)
    for name, case in CASES.items():
        config = case_config(case, paths["model"], paths["model_b"])
        config["output_dir"] = os.path.join(paths["work"], name)
        print(f"LLaMA-Factory: {name}", file=sys.stderr, flush=True)
        results["runs"][name] = train_with_llamafactory(config)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with open(args.worker, encoding="utf-8") as handle:
            paths = json.load(handle)
        results = run_worker(paths)
        with open(paths["output"], "w", encoding="utf-8") as handle:
            json.dump(results, handle)
        return
    with tempfile.TemporaryDirectory() as work:
        paths = {
            "model": os.path.join(work, "model"),
            "model_b": os.path.join(work, "model_b"),
            "work": work,
            "output": os.path.join(work, "results.json"),
        }
        build_model(paths["model"], seed=0)
        build_model(paths["model_b"], seed=1)
        with open(os.path.join(work, "paths.json"), "w", encoding="utf-8") as handle:
            json.dump(paths, handle)
        stubs = (
            Path(os.path.abspath(args.python)).parents[2] / "lf_stubs"
        )  # bench/.venv-lf/bin/python -> bench/lf_stubs
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(stubs),
            HF_HOME=os.path.join(work, "hf_home"),
            TRANSFORMERS_VERBOSITY="error",
        )
        subprocess.run(
            [args.python, __file__, "--worker", os.path.join(work, "paths.json")], check=True, env=env, cwd=work
        )
        with open(paths["output"], encoding="utf-8") as handle:
            results = json.load(handle)
    base = {key: value for key, value in BASE.items() if key != "dataset_dir"}  # a path of this machine
    results["base"], results["cases"], results["tokenized_cases"] = base, CASES, TOKENIZED
    GOLDEN.write_text(json.dumps(results, indent=None) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
