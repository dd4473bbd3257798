"""Regenerate LLaMA-Factory 0.9.5's three-step training runs of GLM-4.1V (glm4v), ERNIE-4.5-VL (full tuning: its LoRA
on every linear layer fails in LLaMA-Factory, docs/MULTIMODAL_FAMILIES.md) and the Omni thinkers that
tests/llm/test_multimodal_mrope_families.py compares `lathe train` against.

    python tests/llm/golden/make_llamafactory_mrope_families_train.py [--python bench/.venv-lf/bin/python]

Runs this file in LLaMA-Factory's environment (`--worker`; lathe is not imported there): the family's tiny model
(make_llamafactory_mrope_families.make_model, every weight set by a seeded-by-name rule, same_weights, so
transformers 5.6 and 5.23 train the same model), its PIL image processor (and Whisper feature extractor, in one
preprocessor_config.json as the Omni repositories ship it), tokenizer and two rows (ROWS) (images as PNG, audio as
32-bit PCM WAV, read by make_llamafactory_families_train's torchaudio stand-in) saved by write_folders, trained by LLaMA-Factory's own `run_exp` with CASES' keys over
make_llamafactory_families_train.train_config. transformers builds Glm4vProcessor, ERNIE's and the Omni processors only with
torchvision (which does not load beside the CPU torch here), so AutoProcessor gives LLaMA-Factory an object with the
folder's image processor and feature extractor (lathe loads those parts itself then). Writes tests/llm/golden/llamafactory_mrope_families_train.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_mrope_families_train.json"
LORA = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 0.05}
QWEN3_OMNI = "Qwen3OmniMoeProcessor"  # the class name LLaMA-Factory counts Qwen3-Omni's audio tokens by
CASES = {
    "glm4v_full": ("glm4v", {}),
    "glm4v_lora": ("glm4v", LORA),
    "qwen2_omni_full": ("qwen2_omni", {}),
    "qwen2_omni_lora": ("qwen2_omni", LORA),
    "qwen3_omni_full": ("qwen3_omni", {}),
    "qwen3_omni_lora": ("qwen3_omni", LORA),
    "qwen3_omni_one_clip_full": ("qwen3_omni", {}),
    "ernie_vl_full": ("ernie_vl", {}),
}
# The rows of each case's batch (the family's first two unless named): an image-and-audio row and a two-image row,
# so the batch holds one audio clip. transformers 5.6 (this run's) encodes the Qwen3-Omni audio of a whole batch in one
# attention window on sdpa/eager, 5.23 (lathe's) in one window per clip: with one clip both agree
# (docs/MULTIMODAL_FAMILIES.md, "Qwen3-Omni training").
ROWS = {"qwen3_omni_one_clip_full": (0, 3)}


def _module(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _module("make_mrope", "make_llamafactory_mrope_families.py")
TRAIN = _module("make_families_train", "make_llamafactory_families_train.py")


def same_weights(model):
    """make_llamafactory_families' rule (every parameter from a generator seeded by its name, biases 0, norm weights
    1), the name also without "language_model": transformers 5.23 nests the Omni thinker's text model under
    `model.language_model`, 5.6 has it as `model`."""
    import zlib

    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            key = ".".join(part for part in name.split(".") if part not in ("model", "language_model"))
            key = key[key.index("lm_head") :] if "lm_head" in key else key
            if name.endswith("bias"):
                parameter.zero_()
            elif "norm" in name.rsplit(".", 2)[-2]:
                parameter.fill_(1.0)
            else:
                generator = torch.Generator().manual_seed(zlib.crc32(key.encode()))
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


def write_folders(root: Path, family: str, fix_tokenizer, rows: tuple[int, ...] = (0, 1)) -> tuple[Path, Path]:
    """(model folder, data folder with the sharegpt dataset "rows"): the tiny model, image processor and tokenizer,
    and the family's rows of those indices (ROWS) with their images as PNG. fix_tokenizer(tokenizer, template) is lathe's or
    LLaMA-Factory's template fix, run before the model is built (its vocabulary holds the template's tokens)."""
    tokenizer = GEN.make_tokenizer(family)
    processor = GEN.make_processor(family, tokenizer)
    fix_tokenizer(tokenizer, GEN.FAMILIES[family][0])
    model = same_weights(GEN.make_model(family, tokenizer))
    folder, data = root / "model", root / "data"
    model.save_pretrained(str(folder))
    processor.image_processor.save_pretrained(str(folder))
    extractor = getattr(processor, "feature_extractor", None)
    if extractor is not None:  # one preprocessor_config.json with both parts, as the Omni repositories ship it
        path = folder / "preprocessor_config.json"
        config = json.loads(path.read_text())
        config.update({key: value for key, value in extractor.to_dict().items() if key not in config})
        named = QWEN3_OMNI if family == "qwen3_omni" else "Qwen2_5OmniProcessor"
        path.write_text(json.dumps({**config, "processor_class": named}, indent=1))
    tokenizer.save_pretrained(str(folder))
    data.mkdir(parents=True)
    items = []
    for row in (GEN.rows_of(family)[index] for index in rows):
        item = {"messages": [{"role": role, "content": content} for role, content in row["messages"]]}
        for name in row.get("images", []):
            GEN.make_image(name).save(data / f"{name}.png")
            item.setdefault("images", []).append(f"{name}.png")
        for name in row.get("audios", []):
            GEN.BASE.write_wav(data / f"{name}.wav", GEN.make_audio(name))
            item.setdefault("audios", []).append(f"{name}.wav")
        items.append(item)
    (data / "rows.json").write_text(json.dumps(items))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages", "images": "images"}
    if extractor is not None:
        columns["audios"] = "audios"
    info = {"file_name": "rows.json", "formatting": "sharegpt", "columns": columns}
    (data / "dataset_info.json").write_text(json.dumps({"rows": {**info, "tags": tags}}))
    return folder, data


def _processor_parts() -> None:
    """AutoProcessor gives LLaMA-Factory the folder's image processor (and the Omni folders' feature extractor)
    inside an object whose class name holds "Processor" (LLaMA-Factory keeps only such) with the attributes its
    plugins read."""
    import transformers
    from transformers import AutoProcessor, Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    class PartsProcessor:
        def __init__(self, **parts):
            self.__dict__.update(parts)

        def save_pretrained(self, path, **kwargs):
            self.image_processor.save_pretrained(path)

    def parts(path, *args, **kwargs):
        # AutoImageProcessor of transformers 5.6 asks for torchvision here: the PIL classes themselves
        config = json.loads((Path(path) / "preprocessor_config.json").read_text())
        if "feature_extractor_type" not in config:  # the folder's PIL image processor (GLM-4.1V's, ERNIE-4.5-VL's)
            named = config["image_processor_type"]
            named = named if named.endswith("Pil") else named.removesuffix("Fast") + "Pil"
            return PartsProcessor(image_processor=getattr(transformers, named).from_pretrained(path))
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
        extractor = WhisperFeatureExtractor.from_pretrained(path)
        named = type(config["processor_class"], (PartsProcessor,), {})  # the folder's processor class name
        return named(image_processor=image_processor, feature_extractor=extractor)

    AutoProcessor.from_pretrained = staticmethod(parts)


def saved_use_cache(output: Path) -> list:
    """use_cache of the saved config.json and of its text_config (None where there is none)."""
    saved = json.loads((output / "config.json").read_text())
    return [saved.get("use_cache"), saved.get("text_config", {}).get("use_cache")]


def run_llamafactory(names: list[str]) -> dict:
    import llamafactory
    import transformers
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    _processor_parts()
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
            family, keys = CASES[name]
            model, data = write_folders(root / name, family, fix_tokenizer, ROWS.get(name, (0, 1)))
            config = TRAIN.train_config(GEN, family, model, data, root / name / "out", **keys)
            for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
                config.pop(key)
            config.update(bf16=False, fp16=False, plot_loss=False)
            count = Count()
            run_exp(config, callbacks=[count])
            with open(root / name / "out" / "trainer_state.json") as handle:
                history = json.load(handle)["log_history"]
            results[name] = {
                "loss": [entry["loss"] for entry in history if "loss" in entry],
                "grad_norm": [entry["grad_norm"] for entry in history if "grad_norm" in entry],
                "trainable": count.counts[0],
                "total": count.counts[1],
            }
            if keys.get("finetuning_type") != "lora":  # a LoRA run saves the adapter alone
                results[name]["saved_use_cache"] = saved_use_cache(root / name / "out")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="bench/lf_stubs", help="the torchaudio stand-in")
    parser.add_argument("--pillow", default="bench/.cache/pillow12", help="Pillow 12.3 (see the encoding generator)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        results = run_llamafactory(args.cases.split(","))
        if GOLDEN.exists():  # a subset of cases updates only those
            results = {**json.loads(GOLDEN.read_text()), **results}
        GOLDEN.write_text(json.dumps(results, indent=1) + "\n")
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
    subprocess.run([args.python, __file__, "--worker", "--cases", args.cases], check=True, env=env)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
