"""Regenerate LLaMA-Factory's Qwen2-VL encoding of image rows that tests/llm/test_multimodal_qwen2vl.py compares
lathe against.

    python tests/llm/golden/make_llamafactory_qwen2vl.py [--python bench/.venv-lf/bin/python]

Runs this same file in LLaMA-Factory's environment (`--worker`, where lathe is not imported). The rows below
(images drawn here with PIL and numpy, never LLaMA-Factory's demo media) go through LLaMA-Factory 0.9.5's
qwen2_vl plugin and template (`process_messages`, then `SupervisedDatasetProcessor`) with the committed BPE
tokenizer (tests/llm/golden/tokenizers/bpe) plus Qwen2-VL's vision tokens, and through its
MultiModalDataCollatorForSeq2Seq (pad_to_multiple_of=8) with a tiny random Qwen2VLForConditionalGeneration
(only its config is read: mrope positions). Image processor: transformers' Qwen2VLImageProcessor, which
without torchvision (none loads here) is its PIL backend (Qwen2VLImageProcessorPil); the torchvision backend
gives slightly different pixel_values, and so do Pillow versions (12.3 and 13.0 upscale differently:
install the Pillow of lathe's environment in LLaMA-Factory's; the version is recorded). Writes tests/llm/golden/llamafactory_qwen2vl.safetensors: the
dump layout of lathe data preview --dump (example.<i>.*, single.<i>.*, pair.<b>.*), plus
`messages.<i>` (the expanded messages) and the versions in the metadata, and `loss.<prefix>`: the tiny
model's loss on each collated batch. A pair's pixel_values (its rows'
images' in order, checked) are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_qwen2vl.safetensors"
TOKENIZER = HERE / "tokenizers" / "bpe"
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE_MAX_PIXELS, IMAGE_MIN_PIXELS = 40 * 40, 16 * 16
CUTOFF_LEN = 1024
IMAGE_SIZES = {"wide": (70, 30), "small": (12, 20), "large": (200, 150), "square": (28, 28)}
ROWS = [
    {"messages": [("user", "<image>What is this?"), ("assistant", "The quick brown fox.")], "images": ["wide"]},
    {
        "messages": [("user", "Compare <image> and <image> ."), ("assistant", "Two plus two is four.")],
        "images": ["small", "large"],
    },
    {
        "messages": [
            ("user", "<image>hello"),
            ("assistant", "You are a helpful assistant."),
            ("user", "What is two plus two?"),
            ("assistant", "four"),
        ],
        "images": ["square"],
    },
    {"messages": [("user", "What is two plus two?"), ("assistant", "Two plus two is four.")], "images": []},
]


def make_image(name: str):
    """A deterministic RGB image of IMAGE_SIZES[name] (width, height): a gradient with a checker pattern."""
    import numpy as np
    from PIL import Image

    width, height = IMAGE_SIZES[name]
    y, x = np.mgrid[0:height, 0:width]
    seed = sum(map(ord, name))
    pixels = np.stack([(x * 7 + seed) % 256, (y * 11 + seed * 3) % 256, ((x // 4 + y // 4) % 2) * 200], -1)
    return Image.fromarray(pixels.astype("uint8"), "RGB")


def make_tokenizer():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    return tokenizer


def make_model(tokenizer):
    """A tiny random Qwen2VLForConditionalGeneration with the tokenizer's vision token ids."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},
            "max_position_embeddings": 2048,
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(config).eval()


def make_image_processor():
    from transformers import Qwen2VLImageProcessor

    # min_pixels as a model's preprocessor_config.json may set it: 2x2 patches per small image (the default,
    # 56*56, gives 4x4 and a golden file twice the size).
    return Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=28 * 28 * 64)


def messages_of(row: dict) -> list[dict]:
    return [{"role": role, "content": content} for role, content in row["messages"]]


def run_llamafactory() -> tuple[dict, dict]:
    from types import SimpleNamespace

    import llamafactory
    import torch
    import transformers
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    tokenizer = make_tokenizer()
    data_args = DataArguments(template="qwen2_vl", cutoff_len=CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    # LLaMA-Factory sets the media keys on the processor (patch_processor); the plugin reads them from there.
    processor = SimpleNamespace(
        image_processor=make_image_processor(),
        image_max_pixels=IMAGE_MAX_PIXELS,
        image_min_pixels=IMAGE_MIN_PIXELS,
        model_input_names=["input_ids", "attention_mask", "pixel_values", "image_grid_thw"],
    )
    tensors, metadata = {}, {}
    for index, row in enumerate(ROWS):
        images = [make_image(name) for name in row["images"]]
        expanded = template.mm_plugin.process_messages(messages_of(row), images, [], [], processor)
        metadata[f"messages.{index}"] = json.dumps(expanded)
    batch = {
        "_prompt": [messages_of(row)[:-1] for row in ROWS],
        "_response": [messages_of(row)[-1:] for row in ROWS],
        "_system": [""] * len(ROWS),
        "_tools": [""] * len(ROWS),
        "_images": [[make_image(name) for name in row["images"]] or None for row in ROWS],
        "_videos": [None] * len(ROWS),
        "_audios": [None] * len(ROWS),
    }
    encoder = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
    )
    encoded = encoder.preprocess_dataset(batch)
    model = make_model(tokenizer)
    collator = MultiModalDataCollatorForSeq2Seq(
        template=template,
        processor=processor,
        model=model,
        tokenizer=tokenizer,
        pad_to_multiple_of=8,
        label_pad_token_id=-100,
    )
    features = []
    for index in range(len(ROWS)):
        feature = {key: encoded[key][index] for key in ("input_ids", "labels", "attention_mask")}
        for key, value in feature.items():
            tensors[f"example.{index}.{key}"] = torch.tensor(value, dtype=torch.int64)
        feature["images"] = encoded["images"][index]
        features.append(feature)

    def collate(prefix, chosen):
        try:
            out = collator([dict(feature) for feature in chosen])
        except Exception as error:
            metadata[f"error.{prefix}"] = f"{type(error).__name__}: {error}"
            return
        with torch.no_grad():  # the tiny model's loss on the batch: the tensors mean the same to the model
            tensors[f"loss.{prefix}"] = model(**out).loss.detach().reshape(1).float()
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}.{key}"] = value.detach().contiguous().clone()
            else:
                metadata[f"json.{prefix}.{key}"] = json.dumps(value, default=str)

    for index, feature in enumerate(features):
        collate(f"single.{index}", [feature])
    for pair in range(len(features) // 2):
        collate(f"pair.{pair}", features[2 * pair : 2 * pair + 2])
    # A pair's pixel_values are its rows' images in order: checked here and left out to keep the file small.
    for pair in range(len(features) // 2):
        rows = [tensors[f"single.{2 * pair + side}.pixel_values"] for side in (0, 1) if ROWS[2 * pair + side]["images"]]
        assert torch.equal(tensors.pop(f"pair.{pair}.pixel_values"), torch.cat(rows))
    import PIL

    metadata["versions"] = json.dumps(
        {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__, "pillow": PIL.__version__}
    )
    metadata["image_processor"] = type(processor.image_processor).__name__
    return tensors, metadata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default=str(HERE.parents[2] / "bench/lf_stubs"), help="the torchaudio stand-in")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        from safetensors.torch import save_file

        tensors, metadata = run_llamafactory()
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=args.stubs,
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
    )
    subprocess.run([args.python, __file__, "--worker"], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
