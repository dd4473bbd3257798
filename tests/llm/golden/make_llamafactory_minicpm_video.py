"""Regenerate LLaMA-Factory's encoding of MiniCPM-V video rows (minicpm_v and minicpm_o templates) that
tests/llm/test_multimodal_minicpm.py compares lathe against.

    python tests/llm/golden/make_llamafactory_minicpm_video.py [--python bench/.venv-lf/bin/python]

LLaMA-Factory 0.9.5's MiniCPMVPlugin slices each sampled frame of a video as an image (max_slice_nums 2, no image
ids), one `(<image>./</image>)` per frame, and reads every frame's size from the row's FIRST video
(`image_sizes[0][k]`, k counting the row's frames); its collator calls the image processor with the batch's videos
(one pixel_values / image_sizes / tgt_sizes entry per video, not per row). Same folder and stand-in remote code as
make_llamafactory_minicpm.py (its write_folder); the videos are tests/llm/media_files.py's MPEG-4 files (hashes
recorded). The minicpm_o template is the same plugin with an audio token: its batches (no audio) also get the
collator's stand-in silence (audio_features, audio_bounds, ...). Rows (ROWS), per template (FAMILIES): one video, another video, two videos, an image and a video (LLaMA-Factory's errors recorded);
batches: each row alone and the two one-video rows together (BATCHES), and a one-video row beside an image row (the
collator's output structure is recorded: its pixel entries are the video's alone). The pair's pixel_values are
left out: they are the single rows' (the test reads them there), and so are minicpm_o's: they are minicpm_v's. Runs in LLaMA-Factory's
environment (`--worker`, transformers 5.6, Pillow 12.3 first on the path); writes
tests/llm/golden/llamafactory_minicpm_video.safetensors in make_llamafactory_minicpm.py's layout (flatten).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_minicpm_video.safetensors"
FAMILIES = ("minicpm_v", "minicpm_o")  # the templates, as lathe names the families
ROWS = [
    {"messages": [("user", "<video>What happens?"), ("assistant", "A walk.")], "videos": ["walk.mp4"]},
    {"messages": [("user", "Describe <video> please."), ("assistant", "It spins.")], "videos": ["spin.mp4"]},
    {"messages": [("user", "<video><video>Same?"), ("assistant", "Yes.")], "videos": ["walk.mp4", "walk.mp4"]},
    {"messages": [("user", "<image><video>Both?"), ("assistant", "No.")], "videos": ["walk.mp4"], "images": ["wide"]},
]
BATCHES = {"single.0": [0], "single.1": [1], "pair.0": [0, 1]}  # the rows LLaMA-Factory encodes
MIXED = "mixed"  # row 0 beside an image row (make_llamafactory_families' first row)


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MINICPM = _module("make_minicpm", HERE / "make_llamafactory_minicpm.py")
BASE = MINICPM.BASE


def messages_of(row: dict) -> list[dict]:
    return [{"role": role, "content": content} for role, content in row["messages"]]


def run_rows(family: str, folder: str, videos: Path, tensors: dict, metadata: dict) -> None:
    import torch
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from transformers import AutoProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    processor = AutoProcessor.from_pretrained(folder, trust_remote_code=True)
    data_args = DataArguments(template=family, cutoff_len=BASE.CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    processor.tokenizer = tokenizer
    for key, value in MINICPM.settings_of(family).items():
        setattr(processor, key, value)
    encoder = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
    )
    features = {}
    for index, row in enumerate(ROWS):
        paths = [str(videos / name) for name in row["videos"]]
        images = [BASE.make_image(name) for name in row.get("images", [])]
        try:
            expanded = template.mm_plugin.process_messages(messages_of(row), images, paths, [], processor)
        except Exception as error:  # recorded: lathe refuses the row naming it
            metadata[f"{family}.error.{index}"] = f"{type(error).__name__}: {error}"
            continue
        metadata[f"{family}.messages.{index}"] = json.dumps(expanded)
        batch = {
            "_prompt": [messages_of(row)[:-1]],
            "_response": [messages_of(row)[-1:]],
            "_system": [""],
            "_tools": [""],
            "_images": [images or None],
            "_videos": [paths],
            "_audios": [None],
        }
        encoded = encoder.preprocess_dataset(batch)
        feature = {key: encoded[key][0] for key in ("input_ids", "labels", "attention_mask")}
        for key, value in feature.items():
            tensors[f"{family}.example.{index}.{key}"] = torch.tensor(value, dtype=torch.int64)
        features[index] = {**feature, "videos": paths}
    collator = MultiModalDataCollatorForSeq2Seq(
        template=template, processor=processor, model=None, tokenizer=tokenizer, pad_to_multiple_of=8
    )
    for prefix, rows in BATCHES.items():
        output = collator([dict(features[row]) for row in rows])
        metadata[f"{family}.{prefix}.structure"] = json.dumps(MINICPM.flatten(output, f"{family}.{prefix}", tensors))
    # The pair's frames are its rows' frames (one entry per video): left out of the file, the test reads the singles'.
    for key in [key for key in tensors if key.startswith(f"{family}.pair.0.data.pixel_values.")]:
        video, frame = key.rsplit(".", 2)[-2:]
        if torch.equal(tensors[key], tensors[f"{family}.single.{video}.data.pixel_values.0.{frame}"]):
            del tensors[key]
    image_row = BASE.ROWS[0]
    images = [BASE.make_image(name) for name in image_row["images"]]
    batch = {"_prompt": [BASE.messages_of(image_row)[:-1]], "_response": [BASE.messages_of(image_row)[-1:]]}
    batch.update({"_system": [""], "_tools": [""], "_images": [images], "_videos": [None], "_audios": [None]})
    encoded = encoder.preprocess_dataset(batch)
    image_feature = {key: encoded[key][0] for key in ("input_ids", "labels", "attention_mask")}
    image_feature["images"] = images
    output = collator([dict(features[0]), image_feature])
    scratch = {}
    metadata[f"{family}.{MIXED}.structure"] = json.dumps(MINICPM.flatten(output, f"{family}.{MIXED}", scratch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="bench/lf_stubs", help="the torchaudio stand-in")
    parser.add_argument("--pillow", default="bench/.cache/pillow12", help="Pillow 12.3 (see the encoding generators)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import llamafactory
        import PIL
        import torch
        import transformers
        from safetensors.torch import save_file

        sys.path.insert(0, str(HERE.parents[2]))
        from tests.llm.media_files import write_video_files

        tensors, metadata = {}, {}
        with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as videos:
            files = write_video_files(Path(videos))
            hashes = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in files.items()}
            MINICPM.write_folder(folder)
            for family in FAMILIES:
                run_rows(family, folder, Path(videos), tensors, metadata)
        # minicpm_o's frames are minicpm_v's (the same image processor): kept once, the test reads minicpm_v's
        for key in [key for key in tensors if key.startswith("minicpm_o.") and ".data.pixel_values." in key]:
            if torch.equal(tensors[key], tensors["minicpm_v." + key.split(".", 1)[1]]):
                del tensors[key]
        versions = {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__}
        metadata["versions"] = json.dumps({**versions, "pillow": PIL.__version__})
        metadata["video_hashes"] = json.dumps(hashes)
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(os.path.abspath(path) for path in (args.pillow, args.stubs) if os.path.isdir(path)),
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
