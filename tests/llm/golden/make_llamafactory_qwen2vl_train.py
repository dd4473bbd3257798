"""Regenerate LLaMA-Factory 0.9.5's three-step Qwen2-VL training runs that tests/llm/test_multimodal_train.py
compares `lathe train` against.

    python tests/llm/golden/make_llamafactory_qwen2vl_train.py [--python /tmp/mm-lf-venv/bin/python]

Runs this file in LLaMA-Factory's environment (`--worker`; lathe is not imported there): the tiny Qwen2-VL model
folder, images and mllm_demo-shaped data of tests/llm/multimodal_cases.py (drawn there, never LLaMA-Factory's demo
media), trained by LLaMA-Factory's own `run_exp` with each case's keys. Without torchvision (none loads beside the
CPU torch here) transformers' AutoProcessor of Qwen2-VL cannot build its video processor, so the worker hands
LLaMA-Factory a processor holding the folder's image processor (the PIL backend) and the tokenizer: the only parts
its qwen2_vl plugin reads for images. Writes tests/llm/golden/llamafactory_qwen2vl_train.json: per case the
logged losses and grad norms, and the trainable and total parameter counts when training starts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_qwen2vl_train.json"

# case -> keys over multimodal_cases.train_config (LLaMA-Factory's defaults otherwise)
CASES = {
    "full": {},
    "lora": {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 0.05},
    "lora_open_tower": {
        "finetuning_type": "lora",
        "lora_target": "all",
        "lora_rank": 4,
        "freeze_vision_tower": False,
        "learning_rate": 0.05,
    },
    "projector_only": {"freeze_language_model": True, "freeze_multi_modal_projector": False},
    "no_images": {"dataset": "text_demo"},
    "freeze_with_projector": {
        "finetuning_type": "freeze",
        "freeze_trainable_layers": 1,
        "freeze_multi_modal_projector": False,
    },
    "dpo": {
        "stage": "dpo",
        "dataset": "mllm_pairs",
        "finetuning_type": "lora",
        "lora_target": "all",
        "lora_rank": 4,
        "learning_rate": 0.05,
        "pref_beta": 0.1,
    },
    "qwen2_5_vl_full": {"model_type": "qwen2_5_vl"},
    "qwen3_vl_full": {"model_type": "qwen3_vl", "template": "qwen3_vl_nothink"},
    "qwen3_vl_lora": {
        "model_type": "qwen3_vl",
        "template": "qwen3_vl_nothink",
        "finetuning_type": "lora",
        "lora_target": "all",
        "lora_rank": 4,
        "learning_rate": 0.05,
    },
    "kto": {
        "stage": "kto",
        "dataset": "mllm_kto",
        "finetuning_type": "lora",
        "lora_target": "all",
        "lora_rank": 4,
        "learning_rate": 0.05,
        "pref_beta": 0.1,
    },
}


def _processor_class():
    from types import SimpleNamespace

    class Qwen2VLImageOnlyProcessor:  # the name holds "Processor": LLaMA-Factory keeps it
        def __init__(self, image_processor, tokenizer):
            self.image_processor, self.tokenizer = image_processor, tokenizer
            # Qwen3VLPlugin reads the video processor's merge_size even for images (no video here)
            self.video_processor = SimpleNamespace(merge_size=image_processor.merge_size)

        def save_pretrained(self, path, **kwargs):
            self.image_processor.save_pretrained(path)

    return Qwen2VLImageOnlyProcessor


def _token_types_when_missing() -> None:
    """LLaMA-Factory 0.9.5's KTO forward passes input_ids, attention_mask and the image tensors but no position ids,
    and transformers' Qwen2-VL then stops asking for mm_token_type_ids (its KTO fails here as it is). The model is
    given the token types it asks for (image tokens 1), from which it computes the mrope positions lathe's collator
    computes with the same get_rope_index."""
    from transformers import Qwen2VLForConditionalGeneration

    forward = Qwen2VLForConditionalGeneration.forward

    def with_token_types(self, input_ids=None, *args, **kwargs):
        if kwargs.get("image_grid_thw") is not None and kwargs.get("position_ids") is None:
            kwargs.setdefault("mm_token_type_ids", (input_ids == self.config.image_token_id).long())
        return forward(self, input_ids, *args, **kwargs)

    Qwen2VLForConditionalGeneration.forward = with_token_types


def run_llamafactory() -> dict:
    sys.path.insert(0, str(HERE.parent))
    import multimodal_cases as cases
    import transformers
    from llamafactory.train.tuner import run_exp
    from transformers import AutoProcessor, Qwen2VLImageProcessor, TrainerCallback

    def image_only(path, *args, **kwargs):
        return _processor_class()(Qwen2VLImageProcessor.from_pretrained(path), None)

    AutoProcessor.from_pretrained = staticmethod(image_only)
    _token_types_when_missing()

    class Count(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen = {id(p): p for p in model.parameters()}.values()
            self.counts = [sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen)]

    results = {"versions": {"transformers": transformers.__version__}}
    import llamafactory

    results["versions"]["llamafactory"] = llamafactory.__version__
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        data = cases.make_data_folder(root / "data")
        models = {}
        for name, keys in CASES.items():
            keys = dict(keys)
            model_type = keys.pop("model_type", "qwen2_vl")
            if model_type not in models:
                models[model_type] = cases.make_model_folder(root / model_type, model_type)
            config = cases.train_config(models[model_type], data, root / name, **keys)
            for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
                config.pop(key)
            config.update(bf16=False, fp16=False, plot_loss=False)
            count = Count()
            run_exp(config, callbacks=[count])
            with open(root / name / "trainer_state.json") as handle:
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
    parser.add_argument("--python", default="/tmp/mm-lf-venv/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="/tmp/mm-lf-stubs", help="the torchaudio stand-in")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        GOLDEN.write_text(json.dumps(run_llamafactory(), indent=1) + "\n")
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=args.stubs,
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="WARNING",
        DISABLE_VERSION_CHECK="1",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
