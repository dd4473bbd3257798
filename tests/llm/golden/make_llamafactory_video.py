"""Regenerate LLaMA-Factory's encoding of video rows (Qwen2-VL and Qwen2.5-VL) that tests/llm/test_multimodal_video.py
compares lathe against.

    python tests/llm/golden/make_llamafactory_video.py [--python bench/.venv-lf/bin/python]

The videos are made with PyAV's MPEG-4 encoder (tests/llm/media_files.py). Runs this same file in LLaMA-Factory
0.9.5's environment (`--worker`, where lathe is not imported) with the torchaudio stand-in of bench/lf_stubs and
torchvision through the test recipe (tests/llm/torchvision_recipe.py: PyPI's torchvision 0.28.0 in a folder, its
compiled-ops registration skipped), so transformers' Qwen2VLVideoProcessor and the torchvision image backend load,
as on a user's machine. For each model type the rows below go through LLaMA-Factory's qwen2_vl plugin and
template (`process_messages`, then `SupervisedDatasetProcessor`) with the committed BPE tokenizer plus the vision
tokens, and through MultiModalDataCollatorForSeq2Seq (pad_to_multiple_of=8) with a tiny random model (mrope
positions with second_per_grid_ts for Qwen2.5-VL) whose loss on each batch is recorded. Writes
tests/llm/golden/llamafactory_video.safetensors: `<model>.example.<i>.*`, `<model>.single.<i>.*`,
`<model>.pair.<b>.*` (less the pixel tensors: its rows' in order), `<model>.loss.<batch>`, and the expanded
messages, file hashes and versions in the metadata.
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
GOLDEN = HERE / "llamafactory_video.safetensors"
MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
TEMPLATES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl", "qwen3_vl": "qwen3_vl_nothink"}
SETTINGS = {  # the processor keys LLaMA-Factory's patch_processor sets (small budgets: a small file)
    "image_max_pixels": 40 * 40,
    "image_min_pixels": 16 * 16,
    "video_max_pixels": 32 * 32,
    "video_min_pixels": 16 * 16,
    "video_fps": 2.0,
    "video_maxlen": 128,
}
# Qwen3-VL's video processor (transformers 5.6) refuses a frame side under its 32-pixel factor: larger frames
SETTINGS_OF = {"qwen3_vl": {**SETTINGS, "video_max_pixels": 48 * 48}}
CUTOFF_LEN = 1024
ROWS = [
    {"messages": [("user", "<video>What happens?"), ("assistant", "The quick brown fox.")], "videos": ["walk.mp4"]},
    {
        "messages": [("user", "<image>Is this in <video> ?"), ("assistant", "Two plus two is four.")],
        "images": ["wide"],
        "videos": ["spin.mp4"],
    },
    {"messages": [("user", "What is two plus two?"), ("assistant", "four")]},
    {
        "messages": [("user", "<video>hello"), ("assistant", "four"), ("user", "And <video> ?"), ("assistant", "two")],
        "videos": ["spin.mp4", "walk.mp4"],
    },
]
# Qwen3-VL: LLaMA-Factory 0.9.5's qwen3_vl plugin reads each video's timestamps by the index of the MESSAGE that holds
# it (video_metadata[message index]) and gives every video the first video's frame count, so a row whose second
# video sits in a later message fails there (IndexError) and two different videos in one message get the first's
# timestamps; the rows here keep one video per row, in the first message, where it is right (lathe times each video
# by its own frames: tests/llm/test_multimodal_video.py)
QWEN3_ROWS = [
    *ROWS[:3],
    {
        "messages": [("user", "<video>hello"), ("assistant", "four"), ("user", "And again?"), ("assistant", "two")],
        "videos": ["spin.mp4"],
    },
]


def rows_of(model_type: str) -> list[dict]:
    return QWEN3_ROWS if model_type == "qwen3_vl" else ROWS


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_processor(model_type: str, tokenizer):
    """The model type's real transformers processor (image processor of the Qwen2-VL golden, a video processor
    of 14-pixel patches), as a model folder's AutoProcessor builds it where torchvision imports."""
    import transformers as tf

    if model_type == "qwen3_vl":  # 16-pixel patches (the multimodal training tests' Qwen3-VL image processor)
        images = _module("cases", HERE.parent / "multimodal_cases.py").make_image_processor("qwen3_vl")
        size = {"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 2 * 16}
        return tf.Qwen3VLProcessor(images, tokenizer, tf.Qwen3VLVideoProcessor(patch_size=16, size=size))
    images = _module("make_qwen2vl", HERE / "make_llamafactory_qwen2vl.py").make_image_processor()
    videos = tf.Qwen2VLVideoProcessor(min_pixels=28 * 28, max_pixels=28 * 28 * 16)
    if model_type == "qwen2_5_vl":
        return tf.Qwen2_5_VLProcessor(images, tokenizer, videos)
    return tf.Qwen2VLProcessor(images, tokenizer, videos)


def make_model(model_type: str, tokenizer):
    """Tiny random weights: the Qwen2-VL golden's model, or a Qwen2.5-VL of the same size (mrope 2/1/1)."""
    import torch
    import transformers

    gen = _module("make_qwen2vl", HERE / "make_llamafactory_qwen2vl.py")
    if model_type == "qwen2_vl":
        return gen.make_model(tokenizer)
    if model_type == "qwen3_vl":  # the multimodal training tests' tiny Qwen3-VL (deepstack, interleaved mrope)
        return _module("cases", HERE.parent / "multimodal_cases.py").make_model(tokenizer, "qwen3_vl")
    ids = dict(zip(gen.VISION_TOKENS, tokenizer.convert_tokens_to_ids(gen.VISION_TOKENS)))
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},
    }
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32}
    vision.update(window_size=56, fullatt_block_indexes=[1], tokens_per_second=2)
    config = transformers.Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(0)
    return transformers.Qwen2_5_VLForConditionalGeneration(config).eval()


def row_media(row: dict, folder: Path) -> tuple[list, list]:
    gen = _module("make_qwen2vl", HERE / "make_llamafactory_qwen2vl.py")
    return [gen.make_image(name) for name in row.get("images", [])], [str(folder / n) for n in row.get("videos", [])]


def messages_of(row: dict) -> list[dict]:
    return [{"role": role, "content": content} for role, content in row["messages"]]


def run_model(model_type: str, folder: Path, tensors: dict, metadata: dict) -> None:
    import torch
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    rows = rows_of(model_type)
    tokenizer = _module("make_qwen2vl", HERE / "make_llamafactory_qwen2vl.py").make_tokenizer()
    data_args = DataArguments(template=TEMPLATES[model_type], cutoff_len=CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    processor = make_processor(model_type, tokenizer)
    for key, value in SETTINGS_OF.get(model_type, SETTINGS).items():  # LLaMA-Factory's patch_processor
        setattr(processor, key, value)
    metadata[f"{model_type}.processors"] = json.dumps(
        [type(processor.image_processor).__name__, type(processor.video_processor).__name__]
    )
    for index, row in enumerate(rows):
        images, videos = row_media(row, folder)
        expanded = template.mm_plugin.process_messages(messages_of(row), images, videos, [], processor)
        metadata[f"{model_type}.messages.{index}"] = json.dumps(expanded)
    media = [row_media(row, folder) for row in rows]
    batch = {
        "_prompt": [messages_of(row)[:-1] for row in rows],
        "_response": [messages_of(row)[-1:] for row in rows],
        "_system": [""] * len(rows),
        "_tools": [""] * len(rows),
        "_images": [images or None for images, _ in media],
        "_videos": [videos or None for _, videos in media],
        "_audios": [None] * len(rows),
    }
    encoder = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
    )
    encoded = encoder.preprocess_dataset(batch)
    model = make_model(model_type, tokenizer)
    collator = MultiModalDataCollatorForSeq2Seq(
        template=template, processor=processor, model=model, tokenizer=tokenizer, pad_to_multiple_of=8
    )
    features = []
    for index in range(len(rows)):
        feature = {key: encoded[key][index] for key in ("input_ids", "labels", "attention_mask")}
        for key, value in feature.items():
            tensors[f"{model_type}.example.{index}.{key}"] = torch.tensor(value, dtype=torch.int64)
        feature["images"], feature["videos"] = encoded["images"][index], encoded["videos"][index]
        features.append(feature)
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
    for prefix, chosen in batches.items():
        out = collator([dict(feature) for feature in chosen])
        with torch.no_grad():
            tensors[f"{model_type}.loss.{prefix}"] = model(**out).loss.detach().reshape(1).float()
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{model_type}.{prefix}.{key}"] = value.detach().contiguous().clone()
            else:
                metadata[f"{model_type}.json.{prefix}.{key}"] = json.dumps(value, default=str)
    # A pair's pixel tensors are its rows' in order: checked here and left out to keep the file small.
    for pair in range(len(features) // 2):
        for key, kind in (("pixel_values", "images"), ("pixel_values_videos", "videos")):
            sides = [2 * pair + side for side in (0, 1) if rows[2 * pair + side].get(kind)]
            if sides:
                parts = [tensors[f"{model_type}.single.{side}.{key}"] for side in sides]
                assert torch.equal(tensors.pop(f"{model_type}.pair.{pair}.{key}"), torch.cat(parts))


def run_llamafactory(folder: Path) -> tuple[dict, dict]:
    import av
    import llamafactory
    import PIL
    import torchvision
    import transformers

    tensors, metadata = {}, {}
    for name in sorted(os.listdir(folder)):
        metadata[f"sha256.{name}"] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    for model_type in MODELS:
        run_model(model_type, folder, tensors, metadata)
    metadata["versions"] = json.dumps(
        {
            "llamafactory": llamafactory.__version__,
            "transformers": transformers.__version__,
            "torchvision": torchvision.__version__,
            "av": av.__version__,
            "pillow": PIL.__version__,
        }
    )
    return tensors, metadata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        from safetensors.torch import save_file

        tensors, metadata = run_llamafactory(Path(args.worker))
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import torchvision_paths

    shim, site = torchvision_paths()
    with tempfile.TemporaryDirectory() as scratch:
        files = _module("media_files", HERE.parent / "media_files.py")
        files.write_video_files(Path(scratch))
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            PYTHONPATH=os.pathsep.join([str(shim), args.stubs, str(site)]),
            TRANSFORMERS_VERBOSITY="error",
            LLAMAFACTORY_VERBOSITY="ERROR",
            OMP_NUM_THREADS="1",
        )
        subprocess.run([args.python, __file__, "--worker", scratch], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
