"""Regenerate LLaMA-Factory 0.9.5's three-step training runs of the tiny Gemma 4 that
tests/llm/test_multimodal_gemma4.py compares `lathe train` against.

    python tests/llm/golden/make_llamafactory_gemma4_train.py [--python bench/.venv-lf/bin/python]

Runs this file in LLaMA-Factory's environment (`--worker`; lathe is not imported there; transformers 5.6) with the
torchaudio stand-in, torchvision through the test recipe (its AutoProcessor builds Gemma4Processor only with the video
processor) and Pillow 12.3 first on the path: write_folders saves the tiny Gemma 4 of make_llamafactory_gemma4.py (weights set
by name), its processor (processor_config.json with the parts nested, written here as transformers 5 writes it),
tokenizer and two rows (images as PNG, audio as 32-bit PCM WAV), and LLaMA-Factory's own `run_exp` trains CASES'
keys over make_llamafactory_families_train.train_config for three steps of one batch of both rows. Writes
tests/llm/golden/llamafactory_gemma4_train.json: per case the logged losses and grad norms and the trainable and
total parameter counts (or the error LLaMA-Factory stopped with).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_gemma4_train.json"
LORA = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 0.05}
CASES = {  # case -> (template, keys over train_config); full tuning keeps the towers frozen (LLaMA-Factory's default)
    "gemma4_full": ("gemma4", {}),
    "gemma4_lora": ("gemma4", LORA),
    "gemma4_open_tower": ("gemma4", {"freeze_vision_tower": False}),
    "gemma4n_audio_full": ("gemma4n", {}),
}
TRAIN_ROWS = {  # two rows per template: images (gemma4); an image with audio and audio alone (gemma4n)
    "gemma4": [
        {"messages": [("user", "<image>What is this?"), ("assistant", "The quick brown fox.")], "images": ["wide"]},
        {
            "messages": [("user", "Compare <image> and <image> ."), ("assistant", "Two plus two is four.")],
            "images": ["small", "large"],
        },
    ],
    "gemma4n": [
        {
            "messages": [("user", "<image>What is <audio> ?"), ("assistant", "The quick brown fox.")],
            "images": ["wide"],
            "audios": ["short"],
        },
        {"messages": [("user", "<audio>hello"), ("assistant", "four")], "audios": ["tone"]},
    ],
}


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEMMA4 = _module("make_gemma4", HERE / "make_llamafactory_gemma4.py")
TRAIN = _module("make_families_train", HERE / "make_llamafactory_families_train.py")
FAMILIES = GEMMA4.FAMILIES


class Settings:
    """What train_config reads of a golden generator (make_llamafactory_families' interface)."""

    CUTOFF_LEN = GEMMA4.CUTOFF_LEN
    FAMILIES = {name: (name, "") for name in TRAIN_ROWS}

    @staticmethod
    def settings_of(template: str) -> dict:
        return {key: value for key, value in GEMMA4.SETTINGS.items() if not key.startswith("video")}


def write_processor(folder: Path) -> None:
    """processor_config.json as transformers 5 saves Gemma4Processor (its parts nested), written from the parts'
    own dicts and the video processor's few keys, so that a folder is made without torchvision too."""
    images, features = GEMMA4.make_parts()
    nested = {
        "audio_ms_per_token": 40,
        "audio_seq_length": 20,
        "image_seq_length": 70,
        "processor_class": "Gemma4Processor",
        "image_processor": {**json.loads(images.to_json_string()), "image_processor_type": "Gemma4ImageProcessor"},
        "feature_extractor": json.loads(features.to_json_string()),
        "video_processor": {
            "video_processor_type": "Gemma4VideoProcessor",
            "patch_size": 2,
            "max_soft_tokens": 70,
            "pooling_kernel_size": 3,
        },
    }
    for part in ("image_processor", "feature_extractor"):
        nested[part].pop("processor_class", None)
    (folder / "processor_config.json").write_text(json.dumps(nested, indent=2))


def write_folders(root: Path, template: str, fix_tokenizer) -> tuple[Path, Path]:
    """(model folder, data folder with the dataset "rows"): fix_tokenizer(tokenizer, template) is lathe's or
    LLaMA-Factory's template fix, run before the model is built (its vocabulary holds the template's tokens)."""
    tokenizer = GEMMA4.make_tokenizer()
    fix_tokenizer(tokenizer, template)
    model, folder, data = GEMMA4.make_model(tokenizer), root / "model", root / "data"
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    write_processor(folder)
    data.mkdir(parents=True)
    rows = []
    for row in TRAIN_ROWS[template]:
        item = {"messages": [{"role": role, "content": content} for role, content in row["messages"]]}
        for name in row.get("images", []):
            FAMILIES.make_image(name).save(data / f"{name}.png")
            item.setdefault("images", []).append(f"{name}.png")
        for name in row.get("audios", []):
            FAMILIES.write_wav(data / f"{name}.wav", FAMILIES.make_audio(name))
            item.setdefault("audios", []).append(f"{name}.wav")
        rows.append(item)
    (data / "rows.json").write_text(json.dumps(rows))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages"}
    columns.update({kind: kind for kind in ("images", "audios") if any(kind in row for row in rows)})
    info = {"rows": {"file_name": "rows.json", "formatting": "sharegpt", "columns": columns, "tags": tags}}
    (data / "dataset_info.json").write_text(json.dumps(info))
    return folder, data


def train_config(name: str, model: Path, data: Path, output: Path) -> dict:
    """The families' training keys; use_fast_tokenizer false: LLaMA-Factory's AutoProcessor (use_fast=that key) then
    takes the PIL image backend, the one lathe has without torchvision (the tokenizer is the same either way)."""
    template, keys = CASES[name]
    return TRAIN.train_config(Settings, template, model, data, output, use_fast_tokenizer=False, **keys)


def run_llamafactory(names: list[str]) -> dict:
    import llamafactory
    import transformers
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    TRAIN._wav_reader()

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    class Count(TrainerCallback):
        counts = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen = {id(p): p for p in model.parameters()}.values()
            self.counts = [sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen)]

    results = {"versions": {"transformers": transformers.__version__, "llamafactory": llamafactory.__version__}}
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        for name in names:
            model, data = write_folders(root / name, CASES[name][0], fix_tokenizer)
            config = train_config(name, model, data, root / name / "out")
            for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
                config.pop(key)
            config.update(bf16=False, fp16=False, plot_loss=False)
            count = Count()
            try:
                run_exp(config, callbacks=[count])
            except Exception as error:  # recorded: the docs say what lathe's test does instead
                traceback.print_exc()
                results[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                continue
            with open(root / name / "out" / "trainer_state.json") as handle:
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
    parser.add_argument("--pillow", default="bench/.cache/pillow12", help="a folder with Pillow 12.3 (lathe's)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        results = run_llamafactory(args.cases.split(","))
        if GOLDEN.exists():  # a subset of cases updates only those
            results = {**json.loads(GOLDEN.read_text()), **results}
        GOLDEN.write_text(json.dumps(results, indent=1) + "\n")
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import torchvision_paths

    shim, site = torchvision_paths()
    paths = [str(shim), os.path.abspath(args.pillow), args.stubs, str(site)]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(path for path in paths if os.path.isdir(path)),
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="WARNING",
        DISABLE_VERSION_CHECK="1",
    )
    subprocess.run([args.python, __file__, "--worker", "--cases", args.cases], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
