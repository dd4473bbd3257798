"""Regenerate LLaMA-Factory 0.9.5's three-step training runs on video rows (Qwen3-VL, LLaVA-NeXT-Video) that
tests/llm/test_multimodal_video.py compares `lathe train` against.

    python tests/llm/golden/make_llamafactory_video_train.py [--python bench/.venv-lf/bin/python]

Runs this file in LLaMA-Factory's environment (`--worker`; lathe is not imported there) with torchvision through the
test recipe (tests/llm/torchvision_recipe.py), as make_llamafactory_video.py does: the video golden's tiny model,
its processor (image and video processors) and tokenizer saved in a model folder (write_folders), two rows in a data
folder (a video; an image and a video, files made with PyAV by tests/llm/media_files.py), trained by LLaMA-Factory's
own `run_exp` with each case's keys (full tuning: the vision tower frozen, LLaMA-Factory's default; LoRA). Writes tests/llm/golden/llamafactory_video_train.json: per case the
logged losses and grad norms, and the trainable and total parameter counts when training starts.
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
GOLDEN = HERE / "llamafactory_video_train.json"
LORA = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 0.05}
CASES = {  # case -> (model type, keys over train_config)
    "qwen3_vl_video_full": ("qwen3_vl", {}),
    "qwen3_vl_video_lora": ("qwen3_vl", LORA),
    "llava_next_video_full": ("llava_next_video", {}),
    # the towers open: LLaMA-Factory's video_llava key (`vision_tower`) names no parameter, so its default freezes
    # nothing there, where lathe freezes image_tower and video_tower (docs/MULTIMODAL_FAMILIES.md)
    "video_llava_open_towers": ("video_llava", {"freeze_vision_tower": False}),
}


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VIDEO = _module("make_video", HERE / "make_llamafactory_video.py")


def write_folders(root: Path, model_type: str, fix_tokenizer) -> tuple[Path, Path]:
    """(model folder, data folder): the video golden's tiny model of `model_type`, its processor and tokenizer; its
    first two rows as dataset "rows" (videos made with PyAV, the image as PNG). fix_tokenizer(tokenizer, template) is
    lathe's or LLaMA-Factory's template fix, run before the model is built (the vocabulary it sizes). Weights that
    transformers 5.6 and 5.23 draw differently from one seed (LLaVA-NeXT-Video's) are set by name as the families'
    training golden sets them (make_llamafactory_families._same_weights); Qwen3-VL's are the same on both."""
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.media_files import write_video_files

    tokenizer = VIDEO.make_tokenizer(model_type)
    fix_tokenizer(tokenizer, VIDEO.TEMPLATES[model_type])
    processor = VIDEO.make_processor(model_type, tokenizer)
    model, data = root / model_type / "model", root / model_type / "data"
    weights = VIDEO.make_model(model_type, tokenizer)
    if model_type != "qwen3_vl":
        weights = _module("families", HERE / "make_llamafactory_families.py")._same_weights(weights)
    weights.save_pretrained(str(model))
    processor.save_pretrained(str(model))
    write_video_files(data)
    rows = []
    for row in VIDEO.rows_of(model_type)[:2]:
        item = {"messages": [{"role": role, "content": content} for role, content in row["messages"]]}
        for name in row.get("images", []):
            _module("make_qwen2vl", HERE / "make_llamafactory_qwen2vl.py").make_image(name).save(data / f"{name}.png")
            item.setdefault("images", []).append(f"{name}.png")
        if row.get("videos"):
            item["videos"] = list(row["videos"])
        rows.append(item)
    (data / "rows.json").write_text(json.dumps(rows))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages", "images": "images", "videos": "videos"}
    info = {"rows": {"file_name": "rows.json", "formatting": "sharegpt", "columns": columns, "tags": tags}}
    (data / "dataset_info.json").write_text(json.dumps(info))
    return model, data


def train_config(model_type: str, model: Path, data: Path, output: Path, **keys) -> dict:
    """Three steps of one batch of both rows, on CPU, with the video golden's media settings."""
    return {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "rows",
        "dataset_dir": str(data),
        "template": VIDEO.TEMPLATES[model_type],
        "cutoff_len": VIDEO.CUTOFF_LEN,
        **VIDEO.SETTINGS_OF[model_type],
        "output_dir": str(output),
        "overwrite_output_dir": True,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1.0e-2,
        "max_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 42,
        "use_cpu": True,
        "preprocessing_num_workers": None,
        "dataloader_num_workers": 0,
        **keys,
    }


def accept_images_none() -> None:
    """LLaMA-Factory 0.9.5 calls LLaVA-NeXT-Video's video processor with images=None, which transformers 5 refuses
    (make_llamafactory_video.accept_images_none): every video processor here drops that one argument."""
    from transformers.video_processing_utils import BaseVideoProcessor

    call = BaseVideoProcessor.__call__

    def without_images(self, *args, images=None, **kwargs):
        assert images is None
        return call(self, *args, **kwargs)

    BaseVideoProcessor.__call__ = without_images


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
    accept_images_none()
    with tempfile.TemporaryDirectory() as root:
        folders = {}
        for name, (model_type, keys) in CASES.items():
            if model_type not in folders:
                folders[model_type] = write_folders(Path(root), model_type, fix_tokenizer)
            config = train_config(model_type, *folders[model_type], Path(root) / name, **keys)
            for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
                config.pop(key)
            config.update(bf16=False, fp16=False, plot_loss=False)
            count = Count()
            run_exp(config, callbacks=[count])
            with open(Path(root) / name / "trainer_state.json") as handle:
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
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        GOLDEN.write_text(json.dumps(run_llamafactory(), indent=1) + "\n")
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import torchvision_paths

    shim, site = torchvision_paths()
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(shim), args.stubs, str(site)]),
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="WARNING",
        DISABLE_VERSION_CHECK="1",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
