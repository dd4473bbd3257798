"""Regenerate the step losses of LLaMA-Factory's fine-tuning methods that tests/llm/test_methods.py
compares `lathe train` against: QLoRA (bitsandbytes 4-bit nf4/fp4, double quantization, 8-bit), LoRA+,
DoRA, rsLoRA, PiSSA (+ conversion), OFT (+ on a 4-bit base), additional_target, continuing and merging
an adapter, LLaMA Pro and the freeze cases.

    python tests/llm/golden/make_llamafactory_methods.py [--python /work/main/bench/.venv-lf/bin/python]

Run with lathe's Python from the repository root. It builds the assets (`build_assets`: a 4-layer Llama
whose weights are drawn from a seeded generator, not from transformers' initialisers, the committed word
tokenizer, 32 alpaca rows, a LoRA adapter), then runs each case through LLaMA-Factory 0.9.5's own
`run_exp` in its environment (`--worker`, one process per case, lathe not imported) with its
`compute_loss` wrapped to record every step's loss at full precision, and writes
tests/llm/golden/llamafactory_methods.json with the versions that produced it. The LLaMA-Factory
environment needs bitsandbytes (pip install bitsandbytes).
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
TOKENIZER = HERE / "tokenizers" / "word"

# Shared by every case; output_dir, model_name_or_path and dataset_dir are filled in per run.
BASE = {
    "stage": "sft",
    "do_train": True,
    "dataset": "toy",
    "template": "qwen",
    "cutoff_len": 64,
    "per_device_train_batch_size": 4,
    "learning_rate": 0.01,
    "lr_scheduler_type": "constant",
    "max_steps": 4,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "overwrite_output_dir": True,
    "seed": 42,
    "disable_tqdm": True,
}
ADAPTER = "<adapter>"  # replaced by the assets' adapter folder
CASES = {
    "lora": {"finetuning_type": "lora"},
    "loraplus": {"finetuning_type": "lora", "loraplus_lr_ratio": 16.0},
    "loraplus_embedding": {
        "finetuning_type": "lora",
        "loraplus_lr_ratio": 4.0,
        "loraplus_lr_embedding": 1e-3,
        "weight_decay": 0.1,
        "lora_target": "embed_tokens,q_proj,v_proj",
    },
    "dora": {"finetuning_type": "lora", "use_dora": True},
    "rslora": {"finetuning_type": "lora", "use_rslora": True, "lora_rank": 4, "lora_alpha": 8},
    "pissa": {"finetuning_type": "lora", "pissa_init": True, "pissa_iter": 16, "pissa_convert": True},
    "pissa_exact_svd": {"finetuning_type": "lora", "pissa_init": True, "pissa_iter": -1},
    "targets_additional": {"finetuning_type": "lora", "lora_target": "q_proj,v_proj", "additional_target": "lm_head"},
    "adapter_continued": {"finetuning_type": "lora", "adapter_name_or_path": ADAPTER},
    "adapter_merged_new": {
        "finetuning_type": "lora",
        "adapter_name_or_path": ADAPTER,
        "create_new_adapter": True,
        "lora_target": "q_proj,v_proj",
    },
    "oft": {"finetuning_type": "oft", "oft_block_size": 32, "oft_target": "all"},
    "oft_rank": {"finetuning_type": "oft", "oft_rank": 4, "oft_block_size": 0, "module_dropout": 0.0},
    "qlora_nf4": {"finetuning_type": "lora", "quantization_bit": 4},
    "qlora_fp4": {
        "finetuning_type": "lora",
        "quantization_bit": 4,
        "quantization_type": "fp4",
        "double_quantization": False,
    },
    "qlora_8bit": {"finetuning_type": "lora", "quantization_bit": 8},
    "qlora_continued": {"finetuning_type": "lora", "quantization_bit": 4, "adapter_name_or_path": ADAPTER},
    "qoft_nf4": {"finetuning_type": "oft", "quantization_bit": 4, "double_quantization": False},
    "freeze": {"finetuning_type": "freeze"},
    "freeze_first_attention": {
        "finetuning_type": "freeze",
        "freeze_trainable_layers": -1,
        "freeze_trainable_modules": "self_attn",
    },
    "freeze_extra_modules": {
        "finetuning_type": "freeze",
        "freeze_trainable_layers": 1,
        "freeze_trainable_modules": "mlp",
        "freeze_extra_modules": "embed_tokens,norm",
    },
    "llama_pro_freeze": {"finetuning_type": "freeze", "use_llama_pro": True, "freeze_trainable_layers": 2},
    "llama_pro_lora": {
        "finetuning_type": "lora",
        "use_llama_pro": True,
        "freeze_trainable_layers": 2,
        "lora_target": "all",
    },
}


def build_assets(folder) -> dict:
    """model/ (tokenizer + 4-layer Llama), data/ (dataset_info.json, 32 rows), adapter/ (a LoRA on q_proj,v_proj)
    in `folder`; every weight drawn from torch.Generator seeds, so both environments read the same files."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    model_dir, data_dir, adapter_dir = folder / "model", folder / "data", folder / "adapter"
    model_dir.mkdir(parents=True, exist_ok=True)
    for item in TOKENIZER.iterdir():
        shutil.copy(item, model_dir / item.name)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    _draw(model, seed=0, scale=0.05)
    model.save_pretrained(str(model_dir))

    from peft import LoraConfig, get_peft_model

    adapted = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    _draw(adapted, seed=1, scale=0.1, only="lora_")
    adapted.save_pretrained(str(adapter_dir))

    data_dir.mkdir(exist_ok=True)
    (data_dir / "train.json").write_text(json.dumps(rows()), encoding="utf-8")
    (data_dir / "dataset_info.json").write_text(
        json.dumps(
            {
                "toy": {"file_name": "train.json"},
            }
        ),
        encoding="utf-8",
    )
    return {"model": str(model_dir), "data": str(data_dir), "adapter": str(adapter_dir)}


def _draw(model, seed: int, scale: float, only: str = "") -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if only not in name:
                continue
            if param.ndim == 1:
                param.fill_(1.0)  # norm scales
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


def rows() -> list[dict]:
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.conftest import WORD_TEXT_TOKENS

    words = [word for word in WORD_TEXT_TOKENS if word.isalpha()]
    rng = random.Random(0)

    def sentence(low, high):
        return " ".join(rng.choice(words) for _ in range(rng.randint(low, high)))

    return [{"instruction": sentence(3, 9), "input": "", "output": sentence(2, 12)} for _ in range(32)]


def case_config(name: str, assets: dict, output_dir: str) -> dict:
    config = {
        **BASE,
        **CASES[name],
        "model_name_or_path": assets["model"],
        "dataset_dir": assets["data"],
        "output_dir": output_dir,
    }
    if config.get("adapter_name_or_path") == ADAPTER:
        config["adapter_name_or_path"] = assets["adapter"]
    return config


# ---- the LLaMA-Factory side (runs in its environment) ----------------------------------------------------
def run_llamafactory(config: dict) -> list[float]:
    import transformers
    from llamafactory.train.tuner import run_exp

    losses = []
    compute_loss = transformers.Trainer.compute_loss

    def recording(self, model, inputs, return_outputs=False, **kwargs):
        result = compute_loss(self, model, inputs, return_outputs=return_outputs, **kwargs)
        if model.training:
            losses.append((result[0] if return_outputs else result).item())
        return result

    transformers.Trainer.compute_loss = recording
    run_exp({**config, "use_cpu": True})
    return losses


def versions(python: str, env: dict) -> dict:
    code = (
        "import json, llamafactory, transformers, peft, bitsandbytes, torch; print(json.dumps({m.__name__: m.__version__ "
        "for m in (llamafactory, transformers, peft, bitsandbytes, torch)}))"
    )
    return json.loads(subprocess.run([python, "-c", code], check=True, env=env, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python", default=str(Path("/work/main/bench/.venv-lf/bin/python")), help="LLaMA-Factory's Python"
    )
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", help="regenerate these cases, keep the others")
    args = parser.parse_args()
    if args.worker:
        Path(args.worker[1]).write_text(json.dumps(run_llamafactory(json.loads(Path(args.worker[0]).read_text()))))
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(Path(args.python).absolute().parents[2] / "lf_stubs"),
        LLAMAFACTORY_VERBOSITY="WARN",
    )
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() and args.only else {"cases": {}}
    with tempfile.TemporaryDirectory() as folder:
        assets = build_assets(folder)
        for name in args.only or CASES:
            config_file, out_file = Path(folder, "config.json"), Path(folder, "losses.json")
            config_file.write_text(json.dumps(case_config(name, assets, str(Path(folder, "out", name)))))
            subprocess.run(
                [args.python, __file__, "--worker", str(config_file), str(out_file)],
                check=True,
                env=env,
                cwd=folder,
                stdout=subprocess.DEVNULL,
            )
            golden["cases"][name] = {"config": CASES[name], "losses": json.loads(out_file.read_text())}
            print(f"{name}: {golden['cases'][name]['losses']}")
            golden.update(versions=versions(args.python, env), base=BASE)
            GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")  # after every case: a failure keeps the others
    print(f"wrote {len(golden['cases'])} cases to {GOLDEN}")


if __name__ == "__main__":
    main()
