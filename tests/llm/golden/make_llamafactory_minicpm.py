"""Regenerate LLaMA-Factory's encoding of MiniCPM-V (minicpm_v template: images) and MiniCPM-o (minicpm_o: images
and audio) rows. tests/llm/test_multimodal_minicpm.py compares lathe against it.

    python tests/llm/golden/make_llamafactory_minicpm.py [--python bench/.venv-lf/bin/python]

MiniCPM-V's processor and tokenizer are remote code in the openbmb model repositories (not reachable here). Both
sides load the same stand-in, tests/llm/golden/minicpm_remote_code.py, from a tiny model folder (write_folder) with
trust_remote_code, as a user's run loads openbmb's: what is compared is LLaMA-Factory 0.9.5's MiniCPMVPlugin token
and collator path (slice placeholders, `<image_id>` numbering, image_bound, tgt_sizes, audio bounds and features),
not openbmb's pixels. Runs in LLaMA-Factory's environment (`--worker`, transformers 5.6, Pillow 12.3 first on the
path as make_llamafactory_mrope_families.py explains); writes tests/llm/golden/llamafactory_minicpm.safetensors: per
family the expanded messages and each structure (metadata), each row's input_ids / labels, and every tensor of the
collator's output for each row alone and for pairs, under flat names (flatten). Then LLaMA-Factory's own run_exp
trains the stand-in model (the same code file: MiniCPM-V's `data` forward contract, vpm / resampler / llm) for three
sft steps on two image rows, typed minicpmo and minicpmv (TRAIN_CASES): tests/llm/golden/llamafactory_minicpm_train.json
(losses, grad norms, counts, or the error).
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
GOLDEN = HERE / "llamafactory_minicpm.safetensors"
REMOTE_CODE = HERE / "minicpm_remote_code.py"
MODULE = "processing_minicpm_standin"  # the remote code's file name in the model folder
FAMILIES = {"minicpm_v": "minicpm_v", "minicpm_o": "minicpm_o"}  # lathe family -> template
TOKENS = ["<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>", "<unk>"]
TOKENS += ["<|audio_start|>", "<|audio_end|>", "<|spk_bos|>", "<|spk_eos|>"]
IMAGE_SETTINGS = {"max_slice_nums": 3, "scale_resolution": 28, "patch_size": 14, "use_image_id": True}
# training case -> the stand-in model's type: transformers 5 skips a minicpmv folder's remote tokenizer class
# (LLaMA-Factory 0.9.5 then fails in its collator; recorded), and loads a minicpmo one's
# (MiniCPM-o's audio case: the minicpm_o template on its image + audio and audio rows)
# (minicpmv last: after transformers 5.6 skips its remote tokenizer class, saving a plain tokenizer in the same
# process fails)
# (minicpmo_video: the minicpm_v template on two one-video rows, VIDEO_ROWS)
TRAIN_CASES = {"minicpmo_typed": "minicpmo", "minicpmo_audio": "minicpmo", "minicpmo_video": "minicpmo"}
TRAIN_CASES["minicpmv_typed"] = "minicpmv"
VIDEO_ROWS = [  # tests/llm/media_files.py's videos (make_llamafactory_minicpm_video.py: their encoding)
    {"messages": [("user", "<video>What happens?"), ("assistant", "A walk.")], "images": [], "videos": ["walk.mp4"]},
    {
        "messages": [("user", "Describe <video> please."), ("assistant", "It spins.")],
        "images": [],
        "videos": ["spin.mp4"],
    },
]
TRAIN_GOLDEN = HERE / "llamafactory_minicpm_train.json"


def _families_generator():
    spec = importlib.util.spec_from_file_location("make_families", HERE / "make_llamafactory_families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = _families_generator()
make_image, make_audio, messages_of, CUTOFF_LEN = BASE.make_image, BASE.make_audio, BASE.messages_of, BASE.CUTOFF_LEN
# MiniCPM-o's rows: an image and an audio, two audios, an image alone (a pair without audio: the stand-in silence),
# no media (alone: the stand-in image and silence).
AUDIO_ROWS = [
    {
        "messages": [("user", "<image><audio>What is this?"), ("assistant", "A fox.")],
        "images": ["wide"],
        "audios": ["short"],
    },
    {
        "messages": [("user", "Compare <audio> and <audio> ."), ("assistant", "Two plus two is four.")],
        "images": [],
        "audios": ["long", "tone"],
    },
    {"messages": [("user", "<image>hello"), ("assistant", "four")], "images": ["square"], "audios": []},
    {
        "messages": [("user", "What is two plus two?"), ("assistant", "Two plus two is four.")],
        "images": [],
        "audios": [],
    },
]


def rows_of(family: str) -> list[dict]:
    return AUDIO_ROWS if family == "minicpm_o" else BASE.ROWS


def settings_of(family: str) -> dict:
    return {"image_max_pixels": BASE.IMAGE_MAX_PIXELS, "image_min_pixels": BASE.IMAGE_MIN_PIXELS}


def media_of(row: dict) -> dict:
    """{"images": [...], "audios": [...]} for the kinds the row has (as LLaMA-Factory's collator takes them)."""
    media = {"images": [make_image(name) for name in row["images"]]}
    media["audios"] = [make_audio(name) for name in row.get("audios", [])]
    return {key: items for key, items in media.items() if items}


def write_folder(folder, fix_tokenizer=None, model_type: str = "minicpmv", template: str = "minicpm_v") -> str:
    """A model folder with the stand-in remote code: the test tokenizer plus MiniCPM's tokens, its class named in
    tokenizer_config.json's auto_map, and preprocessor_config.json naming the processor in auto_map. With
    fix_tokenizer(tokenizer, template) (lathe's or LLaMA-Factory's template fix, run first so the vocabulary holds
    the template's tokens), also the tiny stand-in model of `model_type` (config.json's auto_map, weights set by
    name)."""
    from transformers import AutoTokenizer

    folder = str(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(BASE.TOKENIZER))
    tokenizer.add_special_tokens({"additional_special_tokens": TOKENS})
    if fix_tokenizer is not None:
        fix_tokenizer(tokenizer, template)
    tokenizer.save_pretrained(folder)
    shutil.copyfile(REMOTE_CODE, os.path.join(folder, f"{MODULE}.py"))
    config_file = os.path.join(folder, "tokenizer_config.json")
    with open(config_file) as handle:
        config = json.load(handle)
    config["tokenizer_class"] = "MiniCPMStandInTokenizer"
    config["auto_map"] = {"AutoTokenizer": [None, f"{MODULE}.MiniCPMStandInTokenizer"]}
    with open(config_file, "w") as handle:
        json.dump(config, handle, indent=2)
    processor = {"auto_map": {"AutoProcessor": f"{MODULE}.MiniCPMStandInProcessor"}, **IMAGE_SETTINGS}
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as handle:
        json.dump({**processor, "processor_class": "MiniCPMStandInProcessor"}, handle, indent=2)
    if fix_tokenizer is not None:
        _write_model(folder, len(tokenizer), model_type)
    return folder


def _write_model(folder: str, vocab_size: int, model_type: str) -> None:
    """The stand-in MiniCPM-V model saved with config.json's auto_map naming its classes, every parameter drawn from
    a generator seeded by its name (biases 0): transformers 5.6 and 5.23 load the same weights."""
    import zlib

    import torch

    spec = importlib.util.spec_from_file_location(MODULE, REMOTE_CODE)
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    prefix = {"minicpmv": "MiniCPMStandIn", "minicpmo": "MiniCPMOStandIn"}[model_type]
    config = getattr(code, f"{prefix}Config")(vocab_size=vocab_size)
    config.auto_map = {"AutoConfig": f"{MODULE}.{prefix}Config", "AutoModelForCausalLM": f"{MODULE}.{prefix}Model"}
    model = getattr(code, f"{prefix}Model")(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
            else:
                generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    model.save_pretrained(folder)


def write_train_folders(root: Path, fix_tokenizer, case: str) -> tuple[Path, Path]:
    """(model folder, data folder): the stand-in model's folder (TRAIN_CASES' type) and the first two rows of the
    case's family as the sharegpt dataset "rows" (PNG, 32-bit PCM WAV and MPEG-4 files)."""
    model, data = root / "model", root / "data"
    template = "minicpm_o" if case.endswith("audio") else "minicpm_v"
    write_folder(model, fix_tokenizer, TRAIN_CASES[case], template)
    data.mkdir(parents=True)
    rows, videos = [], {}
    if case.endswith("video"):
        import sys

        sys.path.insert(0, str(HERE.parents[2]))
        from tests.llm.media_files import write_video_files

        videos = write_video_files(data)
    for row in (VIDEO_ROWS if videos else AUDIO_ROWS if template == "minicpm_o" else BASE.ROWS)[:2]:
        item = {"messages": messages_of(row), "images": [], "audios": [], "videos": row.get("videos", [])}
        for name in row["images"]:
            make_image(name).save(data / f"{name}.png")
            item["images"].append(f"{name}.png")
        for name in row.get("audios", []):
            BASE.write_wav(data / f"{name}.wav", make_audio(name))
            item["audios"].append(f"{name}.wav")
        rows.append(item)
    (data / "rows.json").write_text(json.dumps(rows))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages", "images": "images", "audios": "audios", "videos": "videos"}
    info = {"file_name": "rows.json", "formatting": "sharegpt", "columns": columns, "tags": tags}
    (data / "dataset_info.json").write_text(json.dumps({"rows": info}))
    return model, data


def train_config(model: Path, data: Path, output: Path, case: str, **keys) -> dict:
    """Three sft steps of one batch of both rows, on CPU, full tuning (vpm and resampler frozen: LLaMA-Factory's
    defaults for minicpmv), with the model's own code."""
    return {
        "model_name_or_path": str(model),
        "trust_remote_code": True,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "rows",
        "dataset_dir": str(data),
        "template": "minicpm_o" if case.endswith("audio") else "minicpm_v",
        "cutoff_len": CUTOFF_LEN,
        **settings_of("minicpm_v"),
        "output_dir": str(output),
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1.0e-2,
        "max_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 42,
        **keys,
    }


def wav_reader() -> None:
    """LLaMA-Factory's plugins read audio files with torchaudio.load, and no CPU torchaudio exists here (the stubs'
    stand-in raises): its mm_plugin module gets a `load` reading the 32-bit PCM WAV files written here as torchaudio
    does ((channels, samples) float32, divided by 2**31; the files are at audio_sampling_rate: no resampling)."""
    import wave
    from types import SimpleNamespace

    import numpy as np
    import torch
    from llamafactory.data import mm_plugin

    def load(path):
        with wave.open(str(path), "rb") as handle:
            frames = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i4")
            rate, channels = handle.getframerate(), handle.getnchannels()
        samples = (frames.astype("float32") / 2**31).reshape(-1, channels).T
        return torch.from_numpy(np.ascontiguousarray(samples)), rate

    mm_plugin.torchaudio = SimpleNamespace(load=load)


def run_training() -> dict:
    """LLaMA-Factory's own run_exp on the stand-in model's folder, per TRAIN_CASES: losses, grad norms, trainable /
    total counts (or its error)."""
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    class Count(TrainerCallback):
        counts = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen = {id(p): p for p in model.parameters()}.values()
            self.counts = [sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen)]

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    results = {}
    wav_reader()
    for case in TRAIN_CASES:
        with tempfile.TemporaryDirectory() as root:
            model, data = write_train_folders(Path(root), fix_tokenizer, case)
            config = train_config(model, data, Path(root) / "out", case, bf16=False, fp16=False, plot_loss=False)
            count = Count()
            try:
                run_exp(config, callbacks=[count])
            except Exception as error:  # recorded: the docs say what lathe does instead
                results[case] = {"error": f"{type(error).__name__}: {error}"}
                continue
            with open(Path(root) / "out" / "trainer_state.json") as handle:
                history = json.load(handle)["log_history"]
        results[case] = {
            "loss": [entry["loss"] for entry in history if "loss" in entry],
            "grad_norm": [entry["grad_norm"] for entry in history if "grad_norm" in entry],
            "trainable": count.counts[0],
            "total": count.counts[1],
        }
    return results


def flatten(value, prefix: str, tensors: dict) -> object:
    """The collator's output as flat tensors (name: the path, dots between keys and list indices) and its structure
    (dicts and lists kept, each tensor as "T"), which the test compares first."""
    from collections.abc import Mapping

    import torch

    if isinstance(value, Mapping):  # LLaMA-Factory's "data" is a BatchEncoding
        return {key: flatten(item, f"{prefix}.{key}", tensors) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [flatten(item, f"{prefix}.{index}", tensors) for index, item in enumerate(value)]
    if isinstance(value, torch.Tensor):
        tensors[prefix] = value.detach().contiguous().clone()
        return "T"
    return repr(value)


def run_family(family: str, folder: str, tensors: dict, metadata: dict) -> None:
    import torch
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from transformers import AutoProcessor, AutoTokenizer

    # As LLaMA-Factory's load_tokenizer: the model's own classes (trust_remote_code), and patch_processor's keys.
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    processor = AutoProcessor.from_pretrained(folder, trust_remote_code=True)
    data_args = DataArguments(template=FAMILIES[family], cutoff_len=CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    processor.tokenizer = tokenizer
    for key, value in settings_of(family).items():
        setattr(processor, key, value)
    rows = rows_of(family)
    media = [media_of(row) for row in rows]
    for index, row in enumerate(rows):
        images, audios = media[index].get("images", []), media[index].get("audios", [])
        expanded = template.mm_plugin.process_messages(messages_of(row), images, [], audios, processor)
        metadata[f"{family}.messages.{index}"] = json.dumps(expanded)
    batch = {
        "_prompt": [messages_of(row)[:-1] for row in rows],
        "_response": [messages_of(row)[-1:] for row in rows],
        "_system": [""] * len(rows),
        "_tools": [""] * len(rows),
        "_images": [item.get("images") for item in media],
        "_videos": [None] * len(rows),
        "_audios": [item.get("audios") for item in media],
    }
    encoder = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
    )
    encoded = encoder.preprocess_dataset(batch)
    collator = MultiModalDataCollatorForSeq2Seq(
        template=template, processor=processor, model=None, tokenizer=tokenizer, pad_to_multiple_of=8
    )
    features = []
    for index in range(len(rows)):
        feature = {key: encoded[key][index] for key in ("input_ids", "labels", "attention_mask")}
        for key, value in feature.items():
            tensors[f"{family}.example.{index}.{key}"] = torch.tensor(value, dtype=torch.int64)
        features.append({**feature, **media[index]})
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
    for prefix, chosen in batches.items():
        output = collator([dict(feature) for feature in chosen])
        metadata[f"{family}.{prefix}.structure"] = json.dumps(flatten(output, f"{family}.{prefix}", tensors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="bench/lf_stubs", help="the torchaudio stand-in")
    parser.add_argument(
        "--pillow", default="bench/.cache/pillow12", help="Pillow 12.3 (see make_llamafactory_mrope_families.py)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import llamafactory
        import PIL
        import transformers
        from safetensors.torch import save_file

        tensors, metadata = {}, {}
        with tempfile.TemporaryDirectory() as folder:
            write_folder(folder)
            for family in FAMILIES:
                run_family(family, folder, tensors, metadata)
        versions = {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__}
        metadata["versions"] = json.dumps({**versions, "pillow": PIL.__version__})
        save_file(tensors, str(GOLDEN), metadata=metadata)
        training = {"versions": versions, **run_training()}
        TRAIN_GOLDEN.write_text(json.dumps(training, indent=1) + "\n")
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(os.path.abspath(path) for path in (args.pillow, args.stubs) if os.path.isdir(path)),
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        DISABLE_VERSION_CHECK="1",
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes) and {TRAIN_GOLDEN}")


if __name__ == "__main__":
    main()
