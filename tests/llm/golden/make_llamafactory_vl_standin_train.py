"""Regenerate LLaMA-Factory 0.9.5's three-step training runs of Kimi-VL and Youtu-VL stand-in models that
tests/llm/test_multimodal_vl_standin_train.py compares `lathe train` against.

    python tests/llm/golden/make_llamafactory_vl_standin_train.py [--python bench/.venv-lf/bin/python]

Kimi-VL's and Youtu-VL's processors and models are remote code in their model repositories (not reachable here).
Both sides load our own stand-in, tests/llm/golden/vl_remote_code.py, from a tiny model folder (write_folders) with
trust_remote_code, as a user's run loads the real code: Kimi-VL's module names (vision_tower, multi_modal_projector,
language_model: LLaMA-Factory freezes the tower by default) and forward (pixel_values, image_grid_hws, its own loss);
Youtu-VL's one pad per image and a forward that returns no loss (LLaMA-Factory's patch_youtu_vl_model computes it;
it registers no composite model for youtu_vl: nothing is frozen, LoRA `all` wraps the vision layers too). The
tokenizers and processors are the encoding goldens' (make_llamafactory_families_standin.py,
make_llamafactory_youtu_vl.py). Runs LLaMA-Factory's own run_exp (`--worker`, transformers 5.6, Pillow 12.3 first on
the path) for three sft steps of one batch of the families golden's first two image rows, full and LoRA (rank 4,
all, lr 0.05); writes tests/llm/golden/llamafactory_vl_standin_train.json (losses, grad norms, counts).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_vl_standin_train.json"
REMOTE_CODE = HERE / "vl_remote_code.py"
LORA = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 0.05}
CASES = {"kimi_vl_full": ("kimi_vl", {}), "kimi_vl_lora": ("kimi_vl", LORA)}
CASES |= {"youtu_vl_full": ("youtu_vl", {}), "youtu_vl_lora": ("youtu_vl", LORA)}
PARTS = {  # family -> (the stand-in's class prefix, the config key holding the image token's id, that token)
    "kimi_vl": ("KimiVLStandIn", "media_placeholder_token_id", "<|media_pad|>"),
    "youtu_vl": ("YoutuVLStandIn", "image_token_id", "<|image_pad|>"),
}


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STANDIN = _module("make_families_standin", HERE / "make_llamafactory_families_standin.py")
YOUTU = _module("make_youtu_vl", HERE / "make_llamafactory_youtu_vl.py")
TRAIN = _module("make_families_train", HERE / "make_llamafactory_families_train.py")
BASE = STANDIN.BASE


def make_tokenizer(family: str):
    return STANDIN.make_tokenizer(family) if family == "kimi_vl" else YOUTU.make_tokenizer(family)


def write_folders(root: Path, family: str, fix_tokenizer) -> tuple[Path, Path]:
    """(model folder, data folder "rows"): the tokenizer (fixed by lathe's or LLaMA-Factory's template first), the
    stand-in code as vl_standin.py, its processor's preprocessor_config.json, and the tiny model (config.json's
    auto_map naming its classes, every parameter drawn from a generator seeded by its name, biases 0); the first two
    image rows as PNG."""
    import torch

    folder, data = root / "model", root / "data"
    tokenizer = make_tokenizer(family)
    fix_tokenizer(tokenizer, family)
    tokenizer.save_pretrained(str(folder))
    code = _module(f"vl_standin_{family}", REMOTE_CODE)
    prefix, key, token = PARTS[family]
    getattr(code, f"{prefix}Processor")(tokenizer).save_pretrained(str(folder))
    shutil.copyfile(REMOTE_CODE, folder / f"{code.MODULE}.py")
    config = getattr(code, f"{prefix}Config")(
        vocab_size=len(tokenizer), **{key: tokenizer.convert_tokens_to_ids(token)}
    )
    config.auto_map = {
        "AutoConfig": f"{code.MODULE}.{prefix}Config",
        "AutoModelForCausalLM": f"{code.MODULE}.{prefix}Model",
    }
    model = getattr(code, f"{prefix}Model")(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
            else:
                generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    model.save_pretrained(str(folder))
    data.mkdir(parents=True)
    items = []
    for row in BASE.ROWS[:2]:
        item = {"messages": [{"role": role, "content": content} for role, content in row["messages"]], "images": []}
        for name in row["images"]:
            BASE.make_image(name).save(data / f"{name}.png")
            item["images"].append(f"{name}.png")
        items.append(item)
    (data / "rows.json").write_text(json.dumps(items))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    info = {"file_name": "rows.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"}}
    (data / "dataset_info.json").write_text(json.dumps({"rows": {**info, "tags": tags}}))
    return folder, data


def train_config(family: str, model: Path, data: Path, output: Path, **keys) -> dict:
    """make_llamafactory_families_train's three steps with the model's own code."""
    gen = STANDIN if family == "kimi_vl" else _youtu_generator()
    return {**TRAIN.train_config(gen, family, model, data, output, **keys), "trust_remote_code": True}


def _youtu_generator():
    YOUTU.use_in(BASE)  # BASE.FAMILIES names the youtu_vl template
    return BASE


def run_llamafactory() -> dict:
    import llamafactory
    import transformers
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    class Count(TrainerCallback):
        counts = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen = {id(p): p for p in model.parameters()}.values()
            self.counts = [sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen)]

    results = {"versions": {"transformers": transformers.__version__, "llamafactory": llamafactory.__version__}}
    with tempfile.TemporaryDirectory() as root:
        for name, (family, keys) in CASES.items():
            model, data = write_folders(Path(root) / name, family, fix_tokenizer)
            config = train_config(family, model, data, Path(root) / name / "out", **keys)
            for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
                config.pop(key)
            config.update(bf16=False, fp16=False, plot_loss=False)
            count = Count()
            run_exp(config, callbacks=[count])
            with open(Path(root) / name / "out" / "trainer_state.json") as handle:
                history = json.load(handle)["log_history"]
            results[name] = {
                "loss": [entry["loss"] for entry in history if "loss" in entry],
                "grad_norm": [entry["grad_norm"] for entry in history if "grad_norm" in entry],
                "trainable": count.counts[0],
                "total": count.counts[1],
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="bench/lf_stubs", help="the torchaudio stand-in")
    parser.add_argument("--pillow", default="bench/.cache/pillow12", help="Pillow 12.3 (see the encoding generators)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        GOLDEN.write_text(json.dumps(run_llamafactory(), indent=1) + "\n")
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(os.path.abspath(path) for path in (args.pillow, args.stubs) if os.path.isdir(path)),
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="WARNING",
        DISABLE_VERSION_CHECK="1",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
