"""Regenerate what LLaMA-Factory 0.9.5 does with `moe_aux_loss_coef` (its model/model_utils/moe.py configure_moe) that
tests/llm/test_moe.py compares lathe against. Writes tests/llm/golden/llamafactory_moe.json:

- `patched`: for each MoE model type LLaMA-Factory names, and a few it does not (CONFIGS), the config attributes its
  loader changes when a trainable model is loaded with moe_aux_loss_coef (`config.output_router_logits`,
  `text_config.router_aux_loss_coef`, ...), as {attribute: new value}; a type it leaves alone maps to {}.
- `train`: three sft steps of a tiny Qwen3-MoE (one layer, hidden 16, four experts, two per token) on 12 rows of the
  committed word tokenizer's data, by LLaMA-Factory's own `run_exp`, with moe_aux_loss_coef (its router loss added to
  the loss; with and without gradient checkpointing) and without: losses and grad norms.

    python tests/llm/golden/make_llamafactory_moe.py [--python bench/.venv-lf/bin/python] [--stubs bench/lf_stubs]

The worker (`--worker`) runs in LLaMA-Factory's environment (transformers 5.6; lathe not imported there).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_moe.json"
COEF = 0.05
# label -> (model_type, the text_config's model_type for a composite or None). Types transformers does not know
# (deepseek's remote code) are a bare config of that model_type.
CONFIGS = {
    "dbrx": ("dbrx", None),
    "deepseek": ("deepseek", None),
    "ernie4_5_moe": ("ernie4_5_moe", None),
    "granitemoe": ("granitemoe", None),
    "jamba": ("jamba", None),
    "jetmoe": ("jetmoe", None),
    "llama4": ("llama4", None),
    "mixtral": ("mixtral", None),
    "olmoe": ("olmoe", None),
    "phimoe": ("phimoe", None),
    "qwen2_moe": ("qwen2_moe", None),
    "qwen3_moe": ("qwen3_moe", None),
    "glm4v_moe": ("glm4v_moe", "glm4v_moe_text"),
    "internvl_qwen3_moe": ("internvl", "qwen3_moe"),
    # MoE families LLaMA-Factory does not patch: the same key changes nothing there
    "qwen3_omni_moe_thinker": ("qwen3_omni_moe_thinker", None),
    "qwen3_vl_moe": ("qwen3_vl_moe", None),
    "deepseek_v3": ("deepseek_v3", None),
    "glm4_moe": ("glm4_moe", None),
    "gpt_oss": ("gpt_oss", None),
}
ATTRIBUTES = ("output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "aux_loss_coef")
ROWS = 12
# With gradient checkpointing (LLaMA-Factory's default, reentrant) the router logits are recorded in the forward that
# runs without autograd: the router loss joins the logged loss but gives no gradient (equal grad norms with and
# without it); without checkpointing it gives one.
TRAIN_CASES = {
    "qwen3_moe_aux": {"moe_aux_loss_coef": COEF},
    "qwen3_moe_plain": {},
    "qwen3_moe_aux_no_checkpointing": {"moe_aux_loss_coef": COEF, "disable_gradient_checkpointing": True},
}


def _methods_generator():
    spec = importlib.util.spec_from_file_location("make_methods", HERE / "make_llamafactory_methods.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_config(label: str):
    """The label's config, as transformers' AutoConfig builds it (a composite with the named text model)."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type, text_type = CONFIGS[label]
    if model_type not in CONFIG_MAPPING:
        return type("RemoteConfig", (PretrainedConfig,), {"model_type": model_type})()
    if text_type is None:
        return AutoConfig.for_model(model_type)
    return AutoConfig.for_model(model_type, text_config={"model_type": text_type})


def changed_attributes(config, patch) -> dict:
    """{"config.X" / "text_config.X": new value} for the ATTRIBUTES that patch(config) changes."""
    missing = object()
    parts = {"config": config, "text_config": getattr(config, "text_config", None)}
    before = {f"{p}.{a}": getattr(o, a, missing) for p, o in parts.items() if o is not None for a in ATTRIBUTES}
    patch(config)
    after = {f"{p}.{a}": getattr(o, a, missing) for p, o in parts.items() if o is not None for a in ATTRIBUTES}
    return {key: value for key, value in after.items() if value is not before[key] and value != before[key]}


def training_rows() -> list[dict]:
    """The first ROWS rows of make_llamafactory_methods' data (made where pytest imports: tests.llm.conftest)."""
    return _methods_generator().rows()[:ROWS]


def write_folders(root: Path, rows: list[dict]) -> tuple[Path, Path]:
    """(model folder: the word tokenizer and the tiny Qwen3-MoE, data folder with `rows` as the alpaca dataset "toy")."""
    import zlib

    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    methods = _methods_generator()
    model_dir, data_dir = root / "model", root / "data"
    model_dir.mkdir(parents=True)
    for item in methods.TOKENIZER.iterdir():
        shutil.copy(item, model_dir / item.name)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # each weight from a generator seeded by its name: both transformers versions agree
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.fill_(1.0)
            else:
                generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    model.save_pretrained(str(model_dir))
    data_dir.mkdir()
    (data_dir / "train.json").write_text(json.dumps(rows))
    (data_dir / "dataset_info.json").write_text(json.dumps({"toy": {"file_name": "train.json"}}))
    return model_dir, data_dir


def train_config(model: Path, data: Path, output: Path, **keys) -> dict:
    return {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "toy",
        "dataset_dir": str(data),
        "template": "qwen",
        "cutoff_len": 64,
        "output_dir": str(output),
        "per_device_train_batch_size": 4,
        "learning_rate": 1.0e-2,
        "max_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 42,
        "overwrite_output_dir": True,
        **keys,
    }


def run_llamafactory(rows: list[dict]) -> dict:
    from types import SimpleNamespace

    import llamafactory
    import transformers
    from llamafactory.model.model_utils.moe import configure_moe
    from llamafactory.train.tuner import run_exp

    arguments = SimpleNamespace(moe_aux_loss_coef=COEF)  # configure_moe reads this one field
    patched = {
        label: changed_attributes(make_config(label), lambda config: configure_moe(config, arguments, True))
        for label in CONFIGS
    }
    results = {"versions": {"transformers": transformers.__version__, "llamafactory": llamafactory.__version__}}
    results.update(coef=COEF, patched=patched, train={})
    with tempfile.TemporaryDirectory() as root:
        model, data = write_folders(Path(root), rows)
        for name, keys in TRAIN_CASES.items():
            output = Path(root) / name
            run_exp({**train_config(model, data, output, **keys), "bf16": False, "fp16": False, "plot_loss": False})
            history = json.loads((output / "trainer_state.json").read_text())["log_history"]
            results["train"][name] = {
                "keys": keys,
                "loss": [entry["loss"] for entry in history if "loss" in entry],
                "grad_norm": [entry["grad_norm"] for entry in history if "grad_norm" in entry],
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="bench/lf_stubs", help="the torchaudio stand-in")
    parser.add_argument("--worker", metavar="ROWS_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        GOLDEN.write_text(json.dumps(run_llamafactory(json.loads(Path(args.worker).read_text())), indent=1) + "\n")
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=os.path.abspath(args.stubs),
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="WARNING",
        DISABLE_VERSION_CHECK="1",
    )
    with tempfile.TemporaryDirectory() as folder:
        rows = Path(folder) / "rows.json"
        rows.write_text(json.dumps(training_rows()))
        subprocess.run([args.python, __file__, "--worker", str(rows)], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
