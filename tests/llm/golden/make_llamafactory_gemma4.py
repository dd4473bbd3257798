"""Regenerate LLaMA-Factory's encoding of Gemma 4 rows (templates gemma4: images and videos; gemma4n: also audio) that
tests/llm/test_multimodal_gemma4.py compares lathe against.

    python tests/llm/golden/make_llamafactory_gemma4.py [--python bench/.venv-lf/bin/python]

Runs this same file in LLaMA-Factory 0.9.5's environment (`--worker`, where lathe is not imported; transformers 5.6)
with the torchaudio stand-in of bench/lf_stubs, torchvision through the test recipe (tests/llm/torchvision_recipe.py:
Gemma4Processor is built only with its video processor) and Pillow 12.3 first on the path (`--pillow`: lathe's
version; Pillow 13 resizes a few pixels one unit apart). The processor is transformers' real Gemma4Processor at a
tiny size (2-pixel patches, 3x3 pooling, 70 soft tokens at most; Gemma4ImageProcessorPil for images, the torchvision
Gemma4VideoProcessor, a 4-bin Gemma4AudioFeatureExtractor) over the committed BPE tokenizer with Gemma 4's named
media tokens. Each template's rows (ROWS) go through LLaMA-Factory's plugin and template (`process_messages`, then
`SupervisedDatasetProcessor`) and MultiModalDataCollatorForSeq2Seq (pad_to_multiple_of=8) alone and in two pairs;
a tiny Gemma4ForConditionalGeneration (one layer, hidden 16, weights set by name as the families' training golden
sets them) gives each batch's loss. Audio is given as waveforms (LLaMA-Factory 0.9.5 counts a file's audio tokens
from its path string: tests/llm/test_multimodal_gemma4.py). Writes tests/llm/golden/llamafactory_gemma4.safetensors:
`<template>.example.<i>.*`, `<template>.single.<i>.*`, `<template>.pair.<b>.*`, `<template>.loss.<batch>`, the
expanded messages, video file hashes and versions in the metadata.
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
GOLDEN = HERE / "llamafactory_gemma4.safetensors"
TOKENIZER = HERE / "tokenizers" / "bpe"
NAMED_TOKENS = {  # Gemma 4's tokenizer names its media tokens (tokenizer_config.json's extra_special_tokens)
    "image_token": "<|image|>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "audio_token": "<|audio|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
}
VIDEO_TOKEN = "<|video|>"
SETTINGS = {  # the processor keys LLaMA-Factory's patch_processor sets
    "image_max_pixels": 40 * 40,
    "image_min_pixels": 16 * 16,
    "video_max_pixels": 32 * 32,
    "video_min_pixels": 16 * 16,
    "video_fps": 2.0,
    "video_maxlen": 4,
    "audio_sampling_rate": 16000,
}
CUTOFF_LEN = 2048
ROWS = {
    "gemma4": [
        {"messages": [("user", "<image>What is this?"), ("assistant", "The quick brown fox.")], "images": ["wide"]},
        {
            "messages": [("user", "<image>Is this in <video> ?"), ("assistant", "Two plus two is four.")],
            "images": ["small"],
            "videos": ["spin.mp4"],
        },
        {"messages": [("user", "What is two plus two?"), ("assistant", "four")]},
        {
            "messages": [
                ("user", "<video>hello"),
                ("assistant", "four"),
                ("user", "And <video> ?"),
                ("assistant", "two"),
            ],
            "videos": ["walk.mp4", "spin.mp4"],
        },
    ],
    "gemma4n": [
        {
            "messages": [("user", "<image>What is <audio> ?"), ("assistant", "The quick brown fox.")],
            "images": ["wide"],
            "audios": ["short"],
        },
        {"messages": [("user", "What is two plus two?"), ("assistant", "four")]},
        {"messages": [("user", "<audio>hello <audio>"), ("assistant", "four")], "audios": ["long", "tone"]},
        {
            "messages": [("user", "<video>What is <audio> ?"), ("assistant", "two")],
            "videos": ["walk.mp4"],
            "audios": ["tone"],
        },
    ],
}


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAMILIES = _module("make_families", HERE / "make_llamafactory_families.py")  # images, audio, weights by name
make_image, make_audio, messages_of = FAMILIES.make_image, FAMILIES.make_audio, FAMILIES.messages_of


def make_tokenizer():
    """The committed BPE tokenizer with Gemma 4's named media tokens and its video token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER), extra_special_tokens=NAMED_TOKENS)
    tokenizer.add_special_tokens({"additional_special_tokens": [VIDEO_TOKEN]})
    return tokenizer


def make_parts():
    """(image processor, feature extractor): tiny Gemma 4 sizes, the PIL image backend."""
    import transformers as tf

    images = tf.Gemma4ImageProcessorPil(patch_size=2, max_soft_tokens=70, pooling_kernel_size=3)
    return images, tf.Gemma4AudioFeatureExtractor(feature_size=4)


def make_processor(tokenizer):
    """transformers' Gemma4Processor (needs torchvision: its video processor)."""
    import transformers as tf

    images, features = make_parts()
    videos = tf.Gemma4VideoProcessor(patch_size=2, max_soft_tokens=70, pooling_kernel_size=3)
    return tf.Gemma4Processor(features, images, tokenizer, videos, image_seq_length=70, audio_seq_length=20)


def make_model(tokenizer):
    """A tiny Gemma4ForConditionalGeneration (one layer, hidden 16; vision and audio towers) with the tokenizer's
    media token ids, its weights set by name (the families' training golden's rule). The audio attention keeps its
    default chunk (12) and left context (13): transformers 5.6 hard-codes the relative positions those give (12 down
    to 0), 5.23 derives them from the config, so another context gives the two versions different models."""
    import transformers as tf

    ids = tokenizer.convert_tokens_to_ids
    head = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}
    vision = tf.Gemma4VisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        patch_size=2,
        pooling_kernel_size=3,
        position_embedding_size=64,
        **head,
    )
    audio = tf.Gemma4AudioConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        subsampling_conv_channels=[4, 4],
        output_proj_dims=16,
        conv_kernel_size=3,
    )
    text = tf.Gemma4TextConfig(
        vocab_size=len(tokenizer),
        vocab_size_per_layer_input=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        hidden_size_per_layer_input=4,
        sliding_window=16,
        layer_types=["full_attention"],
        global_head_dim=8,
        pad_token_id=tokenizer.pad_token_id,
        **head,
    )
    config = tf.Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        image_token_id=ids(NAMED_TOKENS["image_token"]),
        boi_token_id=ids(NAMED_TOKENS["boi_token"]),
        eoi_token_id=ids(NAMED_TOKENS["eoi_token"]),
        video_token_id=ids(VIDEO_TOKEN),
        audio_token_id=ids(NAMED_TOKENS["audio_token"]),
        boa_token_id=ids(NAMED_TOKENS["boa_token"]),
        eoa_token_index=ids(NAMED_TOKENS["eoa_token"]),
    )
    return FAMILIES._same_weights(tf.Gemma4ForConditionalGeneration(config)).eval()


def media_of(row: dict, videos: Path) -> dict:
    """The row's media as LLaMA-Factory's encoder and collator take them (audio as waveforms)."""
    return {
        "images": [make_image(name) for name in row.get("images", [])],
        "videos": [str(videos / name) for name in row.get("videos", [])],
        "audios": [make_audio(name.split(".")[0]) for name in row.get("audios", [])],
    }


def run_template(template_name: str, videos: Path, tensors: dict, metadata: dict) -> None:
    import torch
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    tokenizer = make_tokenizer()
    processor = make_processor(tokenizer)
    data_args = DataArguments(template=template_name, cutoff_len=CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    for key, value in SETTINGS.items():  # LLaMA-Factory's patch_processor sets them on the processor
        setattr(processor, key, value)
    model = make_model(tokenizer)
    rows, name = ROWS[template_name], template_name
    for index, row in enumerate(rows):
        media = media_of(row, videos)
        expanded = template.mm_plugin.process_messages(
            messages_of(row), media["images"], media["videos"], media["audios"], processor
        )
        metadata[f"{name}.messages.{index}"] = json.dumps(expanded)
    batch = {
        "_prompt": [messages_of(row)[:-1] for row in rows],
        "_response": [messages_of(row)[-1:] for row in rows],
        "_system": [""] * len(rows),
        "_tools": [""] * len(rows),
        **{
            f"_{kind}": [media_of(row, videos)[kind] or None for row in rows] for kind in ("images", "videos", "audios")
        },
    }
    encoder = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
    )
    encoded = encoder.preprocess_dataset(batch)
    collator = MultiModalDataCollatorForSeq2Seq(
        template=template, processor=processor, model=None, tokenizer=tokenizer, pad_to_multiple_of=8
    )
    features = []
    for index, row in enumerate(rows):
        feature = {key: encoded[key][index] for key in ("input_ids", "labels", "attention_mask")}
        for key, value in feature.items():
            tensors[f"{name}.example.{index}.{key}"] = torch.tensor(value, dtype=torch.int64)
        feature.update({kind: items for kind, items in media_of(row, videos).items() if items})
        features.append(feature)
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
    for prefix, chosen in batches.items():
        out = collator([dict(feature) for feature in chosen])
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{name}.{prefix}.{key}"] = value.detach().contiguous().clone()
            else:
                metadata[f"{name}.json.{prefix}.{key}"] = json.dumps(value, default=str)
        with torch.no_grad():
            tensors[f"{name}.loss.{prefix}"] = model(**out).loss.detach().reshape(1)
    derive_pairs(name, rows, tensors, metadata)
    metadata[f"{name}.processor"] = "+".join(
        type(part).__name__ for part in (processor, processor.image_processor, processor.video_processor)
    )


MEDIA_KEYS = {  # the collated media tensors, by the kind of media they come from
    "pixel_values": "images",
    "image_position_ids": "images",
    "pixel_values_videos": "videos",
    "video_position_ids": "videos",
    "input_features": "audios",
    "input_features_mask": "audios",
}


def derive_pairs(name: str, rows: list[dict], tensors: dict, metadata: dict) -> None:
    """A pair's media tensor that is its rows' own tensors joined (the rows with that kind of media) is left out of
    the file (`<template>.derived`: key -> rows); the test joins the singles' golden tensors again."""
    import torch

    derived = {}
    for pair in range(len(rows) // 2):
        for key, kind in MEDIA_KEYS.items():
            full = f"{name}.pair.{pair}.{key}"
            with_media = [row for row in (2 * pair, 2 * pair + 1) if rows[row].get(kind)]
            parts = [tensors.get(f"{name}.single.{row}.{key}") for row in with_media]
            if full not in tensors or not parts or any(part is None for part in parts):
                continue
            if len({part.shape[1:] for part in parts}) == 1 and torch.equal(torch.cat(parts), tensors[full]):
                del tensors[full]
                derived[full] = with_media
    metadata[f"{name}.derived"] = json.dumps(derived)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--pillow", default="bench/.cache/pillow12", help="a folder with Pillow 12.3 (lathe's)")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import llamafactory
        import PIL
        import transformers
        from safetensors.torch import save_file

        tensors, metadata = {}, {}
        for template_name in ROWS:
            run_template(template_name, Path(args.worker), tensors, metadata)
        videos = {
            name: hashlib.sha256((Path(args.worker) / name).read_bytes()).hexdigest()
            for name in ("walk.mp4", "spin.mp4")
        }
        metadata["videos"] = json.dumps(videos)
        metadata["versions"] = json.dumps(
            {
                "llamafactory": llamafactory.__version__,
                "transformers": transformers.__version__,
                "pillow": PIL.__version__,
            }
        )
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import torchvision_paths

    shim, site = torchvision_paths()
    with tempfile.TemporaryDirectory() as scratch:
        _module("media_files", HERE.parent / "media_files.py").write_video_files(Path(scratch))
        paths = [str(shim), os.path.abspath(args.pillow), args.stubs, str(site)]
        env = dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            PYTHONPATH=os.pathsep.join(path for path in paths if os.path.isdir(path)),
            TRANSFORMERS_VERBOSITY="error",
            LLAMAFACTORY_VERBOSITY="ERROR",
            OMP_NUM_THREADS="1",
        )
        subprocess.run([args.python, __file__, "--worker", scratch], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
