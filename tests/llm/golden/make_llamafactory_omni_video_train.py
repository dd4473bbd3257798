"""Regenerate LLaMA-Factory 0.9.5's three-step trainings of the tiny Qwen2.5-Omni thinker on video rows, with and
without use_audio_in_video, through transformers' own Qwen2_5OmniProcessor (torchvision, by the test recipe), that
tests/llm/test_multimodal_mrope_families.py compares `lathe train` against in its recipe subprocess.

    python tests/llm/golden/make_llamafactory_omni_video_train.py [--python bench/.venv-lf/bin/python]

Runs this file in LLaMA-Factory's environment (`--worker`; lathe is not imported there) with torchvision through the
recipe, the torchaudio stand-in and Pillow 12.3 (`--pillow`). write_folders saves the mrope families golden's tiny
thinker (make_llamafactory_mrope_families.make_model, weights set by name: make_llamafactory_mrope_families_train's
same_weights), the real processor of make_llamafactory_omni_video.make_processor (processor.save_pretrained: both
sides load it with AutoProcessor) and the first two video rows (a video with its audio; an image, a video and its
audio) as PNG, MP4 (tests/llm/media_files.py) and 32-bit PCM WAV; LLaMA-Factory's run_exp trains CASES' keys over
make_llamafactory_families_train.train_config. Writes tests/llm/golden/llamafactory_omni_video_train.json.
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
GOLDEN = HERE / "llamafactory_omni_video_train.json"
CASES = {  # case -> (the mrope generator's family: its settings say use_audio_in_video, keys over train_config)
    "qwen2_omni_video_full": ("qwen2_omni_video", {}),
    "qwen2_omni_video_apart_full": ("qwen2_omni_video_apart", {}),
}


def _module(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _module("make_mrope", "make_llamafactory_mrope_families.py")
MROPE_TRAIN = _module("make_mrope_train", "make_llamafactory_mrope_families_train.py")
OMNI_VIDEO = _module("make_omni_video", "make_llamafactory_omni_video.py")
TRAIN = MROPE_TRAIN.TRAIN  # make_llamafactory_families_train: train_config, the WAV reader


def write_folders(root: Path, family: str, fix_tokenizer) -> tuple[Path, Path]:
    """(model folder, data folder with the sharegpt dataset "rows"): the tiny thinker, the real Omni processor and
    the tokenizer, and the family's first two rows with their images, videos and audio as files."""
    tokenizer = GEN.make_tokenizer(family)
    processor = OMNI_VIDEO.make_processor(GEN, tokenizer)
    fix_tokenizer(tokenizer, GEN.FAMILIES[family][0])
    model = MROPE_TRAIN.same_weights(GEN.make_model(family, tokenizer))
    folder, data = root / "model", root / "data"
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    data.mkdir(parents=True)
    GEN.media_files().write_video_files(data)
    items = []
    for row in GEN.rows_of(family)[:2]:
        item = {"messages": [{"role": role, "content": content} for role, content in row["messages"]]}
        item["videos"] = list(row["videos"])
        for name in row.get("images", []):
            GEN.make_image(name).save(data / f"{name}.png")
            item.setdefault("images", []).append(f"{name}.png")
        for name in row["audios"]:
            GEN.BASE.write_wav(data / f"{name}.wav", GEN.make_audio(name))
            item.setdefault("audios", []).append(f"{name}.wav")
        items.append(item)
    (data / "rows.json").write_text(json.dumps(items))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {kind: kind for kind in ("messages", "images", "videos", "audios")}
    info = {"file_name": "rows.json", "formatting": "sharegpt", "columns": columns, "tags": tags}
    (data / "dataset_info.json").write_text(json.dumps({"rows": info}))
    return folder, data


def train_config(family: str, model: Path, data: Path, output: Path, **keys) -> dict:
    return TRAIN.train_config(GEN, family, model, data, output, **keys)


def run_llamafactory() -> dict:
    import llamafactory
    import torchvision
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

    results = {
        "versions": {
            "transformers": transformers.__version__,
            "llamafactory": llamafactory.__version__,
            "torchvision": torchvision.__version__,
        }
    }
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        for name, (family, keys) in CASES.items():
            model, data = write_folders(root / name, family, fix_tokenizer)
            config = train_config(family, model, data, root / name / "out", **keys)
            for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
                config.pop(key)
            config.update(bf16=False, fp16=False, plot_loss=False)
            count = Count()
            run_exp(config, callbacks=[count])
            history = json.loads((root / name / "out" / "trainer_state.json").read_text())["log_history"]
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
    parser.add_argument("--pillow", default=str(HERE.parents[2] / "bench/.cache/pillow12"), help="Pillow 12.3")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        GOLDEN.write_text(json.dumps(run_llamafactory(), indent=1) + "\n")
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import torchvision_paths

    shim, site = torchvision_paths()
    paths = [str(shim), args.pillow, args.stubs, str(site)]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(path for path in paths if os.path.isdir(path)),
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="WARNING",
        DISABLE_VERSION_CHECK="1",
        OMP_NUM_THREADS="1",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
