"""Regenerate LLaMA-Factory 0.9.5's three-step training runs of MiniCPM-V 4.6 (a tiny
MiniCPMV4_6ForConditionalGeneration) that tests/llm/test_multimodal_minicpm_v_4_6.py compares `lathe train` against.

    python tests/llm/golden/make_llamafactory_minicpm_v_4_6_train.py [--lf-package bench/.venv-lf/lib/python3.11/site-packages/llamafactory]

LLaMA-Factory's venv (transformers 5.6) has no minicpmv4_6, so, as make_llamafactory_minicpm_v_4_6.py does for the
encoding, LLaMA-Factory 0.9.5's own package runs under lathe's Python (transformers 5.23) with torchvision through
the test recipe, the torchaudio stand-in of bench/lf_stubs and that generator's `omegaconf` stand-in. Its run_exp
imports more: `trl` here is 1.16, which no longer has AutoModelForCausalLMWithValueHead, PPOConfig or PPOTrainer;
LLaMA-Factory imports them at module level for its value-head (rm, ppo) paths, so the worker gives trl stand-ins of
those three names that raise if built (an sft run never builds them). write_folders saves the tiny model, the PIL
image processor and the tokenizer (the model folder), and the first two image rows as PNG (the data folder);
run_exp trains three sft steps of one batch of both rows per CASES. LLaMA-Factory loads the processor with
AutoProcessor(use_fast=True), which with torchvision picks the torchvision image backend; the worker gives that
processor the folder's PIL image processor instead, as lathe loads it without torchvision (the pixels then agree).
Writes tests/llm/golden/llamafactory_minicpm_v_4_6_train.json (losses, grad norms, trainable / total counts).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_minicpm_v_4_6_train.json"
LORA = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 0.05}
CASES = {"minicpm_v_4_6_full": {}, "minicpm_v_4_6_lora": LORA}  # full: LLaMA-Factory's default freezing
TRL_STAND_INS = ("AutoModelForCausalLMWithValueHead", "PPOConfig", "PPOTrainer")


def _module(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ENCODING = _module("make_minicpm_v_4_6", "make_llamafactory_minicpm_v_4_6.py")
TRAIN = _module("make_families_train", "make_llamafactory_families_train.py")
BASE = ENCODING.BASE


def write_folders(root: Path, fix_tokenizer) -> tuple[Path, Path]:
    """(model folder, data folder with the sharegpt dataset "rows"): the tiny model (weights set by name), the PIL
    image processor and the tokenizer, and the families golden's first two image rows (one image, two images).
    fix_tokenizer(tokenizer, template) is lathe's or LLaMA-Factory's template fix, run before the model is built."""
    tokenizer = ENCODING.make_tokenizer()
    fix_tokenizer(tokenizer, "minicpm_v_4_6")
    folder, data = root / "model", root / "data"
    ENCODING.make_model(tokenizer).save_pretrained(str(folder))
    ENCODING.make_image_processor().save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
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


def train_config(model: Path, data: Path, output: Path, **keys) -> dict:
    """make_llamafactory_families_train's three steps with the encoding golden's media settings, without gradient
    checkpointing: LLaMA-Factory 0.9.5's checkpointing wrapper reads `func.func.__self__`, and transformers 5.23's
    layers pass it a partial of a plain function (AttributeError: 'function' object has no attribute '__self__');
    recomputing activations changes no number."""
    ENCODING.use_in(BASE)  # BASE.FAMILIES names the minicpm_v_4_6 template
    keys = {"disable_gradient_checkpointing": True, **keys}
    return TRAIN.train_config(BASE, "minicpm_v_4_6", model, data, output, **keys)


def _trl_stand_ins() -> None:
    import trl

    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} is a stand-in: trl 1.16 has none, and sft never builds it")

    for name in TRL_STAND_INS:
        if not hasattr(trl, name):
            setattr(trl, name, type(name, (), {"__init__": refuse, "from_pretrained": classmethod(refuse)}))


def _pil_image_processor() -> None:
    """AutoProcessor as LLaMA-Factory calls it, its image processor then replaced by the folder's PIL one."""
    from transformers import AutoProcessor, MiniCPMV4_6ImageProcessorPil

    load = AutoProcessor.from_pretrained

    def pil(path, *args, **kwargs):
        processor = load(path, *args, **kwargs)
        processor.image_processor = MiniCPMV4_6ImageProcessorPil.from_pretrained(path)
        return processor

    AutoProcessor.from_pretrained = staticmethod(pil)


def run_llamafactory() -> dict:
    _trl_stand_ins()
    import llamafactory
    import transformers
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    _pil_image_processor()

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    class Count(TrainerCallback):
        counts = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen = {id(p): p for p in model.parameters()}.values()
            self.counts = [sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen)]

    results = {"versions": {"transformers": transformers.__version__, "llamafactory": llamafactory.__version__}}
    with tempfile.TemporaryDirectory() as root:
        for name, keys in CASES.items():
            model, data = write_folders(Path(root) / name, fix_tokenizer)
            config = train_config(model, data, Path(root) / name / "out", **keys)
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
    default = "bench/.venv-lf/lib/python3.11/site-packages/llamafactory"
    parser.add_argument("--lf-package", default=default, help="LLaMA-Factory 0.9.5's installed package folder")
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        GOLDEN.write_text(json.dumps(run_llamafactory(), indent=1) + "\n")
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import torchvision_paths

    shim, site = torchvision_paths()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        (scratch / "llamafactory").symlink_to(os.path.abspath(args.lf_package))
        (scratch / "omegaconf").mkdir()
        (scratch / "omegaconf" / "__init__.py").write_text(ENCODING.OMEGACONF)
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            PYTHONPATH=os.pathsep.join([str(shim), str(scratch), args.stubs, str(site)]),
            TRANSFORMERS_VERBOSITY="error",
            LLAMAFACTORY_VERBOSITY="WARNING",
            DISABLE_VERSION_CHECK="1",
            OMP_NUM_THREADS="1",
        )
        subprocess.run([sys.executable, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
