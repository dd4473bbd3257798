"""Regenerate LLaMA-Factory's encoding of video rows (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA-NeXT-Video, Video-LLaVA,
InternVL) that tests/llm/test_multimodal_video.py compares lathe against.

    python tests/llm/golden/make_llamafactory_video.py [--python bench/.venv-lf/bin/python]

The videos are made with PyAV's MPEG-4 encoder (tests/llm/media_files.py). Runs this same file in LLaMA-Factory
0.9.5's environment (`--worker`, where lathe is not imported) with the torchaudio stand-in of bench/lf_stubs and
torchvision through the test recipe (tests/llm/torchvision_recipe.py: PyPI's torchvision 0.28.0 in a folder, its
compiled-ops registration skipped), so transformers' video processors and the torchvision image backends load, as on
a user's machine. For each model type (MODELS) its rows (rows_of) go through LLaMA-Factory's plugin and template
(`process_messages`, then `SupervisedDatasetProcessor`) with the committed BPE tokenizer plus the family's vision
tokens, and through MultiModalDataCollatorForSeq2Seq (pad_to_multiple_of=8) with a tiny random model (mrope
positions for the Qwen families) whose loss on each batch is recorded, with the sum of its weights (another
transformers may draw others from the seed). LLaMA-Factory's `video_processor(images=None, ...)` call, which
transformers 5 refuses, is bridged for LLaVA-NeXT-Video and Video-LLaVA (accept_images_none). Writes
tests/llm/golden/llamafactory_video.safetensors: `<model>.example.<i>.*`, `<model>.single.<i>.*`,
`<model>.pair.<b>.*` (less the pixel tensors that are their rows' joined: `<model>.derived`), `<model>.loss.<batch>`,
and the expanded messages, non-tensor values, file hashes and versions in the metadata.
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
MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava_next_video", "video_llava", "intern_vl")
TEMPLATES = {
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_vl",
    "qwen3_vl": "qwen3_vl_nothink",
    "llava_next_video": "llava_next_video",
    "video_llava": "video_llava",
    "intern_vl": "intern_vl",
}
SETTINGS = {  # the processor keys LLaMA-Factory's patch_processor sets (small budgets: a small file)
    "image_max_pixels": 40 * 40,
    "image_min_pixels": 16 * 16,
    "video_max_pixels": 32 * 32,
    "video_min_pixels": 16 * 16,
    "video_fps": 2.0,
    "video_maxlen": 128,
}
# Qwen3-VL's video processor (transformers 5.6) refuses a frame side under its 32-pixel factor: larger frames
# LLaVA-NeXT-Video and Video-LLaVA: LLaMA-Factory 0.9.5 counts every video's tokens from the first video's frames
# (and the processor stacks a batch's videos), so their videos are cut to 4 frames each (video_maxlen)
SETTINGS_OF = {
    "qwen3_vl": {**SETTINGS, "video_max_pixels": 48 * 48},
    "llava_next_video": {**SETTINGS, "video_maxlen": 4},
    "video_llava": {**SETTINGS, "video_maxlen": 4},
}
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


# InternVL: LLaMA-Factory 0.9.5 puts a call's images before its videos in pixel_values, whatever their order in the
# text (its "NOT SUPPORT IMAGE VIDEO INTERLEAVED"), and a batch's images before all its videos; the rows and pairs
# here have no video before an image, where that order is the text's (lathe keeps the text's order always)
INTERN_ROWS = [
    ROWS[1],
    ROWS[2],
    ROWS[0],
    {
        "messages": [("user", "<video>hello"), ("assistant", "four"), ("user", "And <video> ?"), ("assistant", "two")],
        "videos": ["spin.mp4", "walk.mp4"],
    },
]


def rows_of(model_type: str) -> list[dict]:
    return {"qwen3_vl": QWEN3_ROWS, "intern_vl": INTERN_ROWS}.get(model_type, ROWS)


# InternVLProcessor reads its tokens by name from the tokenizer (as InternVL3-hf's tokenizer_config.json names them)
INTERN_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}


def make_tokenizer(model_type: str):
    """The committed BPE tokenizer with the family's vision tokens (InternVL's named)."""
    qwen2vl = _module("make_qwen2vl", HERE / "make_llamafactory_qwen2vl.py")
    if model_type == "intern_vl":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(qwen2vl.TOKENIZER), extra_special_tokens=INTERN_TOKENS)
        tokenizer.add_special_tokens({"additional_special_tokens": qwen2vl.VISION_TOKENS})
        return tokenizer
    tokenizer = qwen2vl.make_tokenizer()
    if model_type in ("llava_next_video", "video_llava"):
        tokenizer.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
    return tokenizer


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_processor(model_type: str, tokenizer):
    """The model type's real transformers processor (image processor of the Qwen2-VL golden, a video processor
    of 14-pixel patches), as a model folder's AutoProcessor builds it where torchvision imports."""
    import transformers as tf

    if model_type == "llava_next_video":  # 56-pixel frames and tiles: 4x4 patches, 2x2 after the video pooling
        images = tf.LlavaNextImageProcessor(
            size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}, image_grid_pinpoints=PINPOINTS
        )
        videos = tf.LlavaNextVideoVideoProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
        return tf.LlavaNextVideoProcessor(videos, images, tokenizer, **LLAVA_COUNTS)
    if model_type == "video_llava":  # 28-pixel crops: 2x2 patches and the CLS token per frame
        images = tf.VideoLlavaImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
        videos = tf.VideoLlavaVideoProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
        return tf.VideoLlavaProcessor(images, videos, tokenizer, **LLAVA_COUNTS)
    if model_type == "intern_vl":  # 28-pixel tiles, one context token each; its image processor takes every frame
        images = tf.GotOcr2ImageProcessor(size={"height": 28, "width": 28}, max_patches=3)
        videos = tf.InternVLVideoProcessor(size={"height": 28, "width": 28})
        return tf.InternVLProcessor(images, tokenizer, videos, image_seq_length=1)
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
    if model_type in ("llava_next_video", "video_llava", "intern_vl"):
        return make_llava_model(model_type, tokenizer)
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


PINPOINTS = [[56, 112], [112, 56]]
LLAVA_COUNTS = {"patch_size": 14, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}
TINY_TEXT = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}


def make_llava_model(model_type: str, tokenizer):
    """A tiny random LLaVA-NeXT-Video, Video-LLaVA or InternVL (one layer, hidden size 16) for the processors above."""
    import torch
    import transformers as tf

    ids = tokenizer.convert_tokens_to_ids
    text = tf.LlamaConfig(**TINY_TEXT, vocab_size=len(tokenizer), num_key_value_heads=1, head_dim=8)
    if model_type == "intern_vl":
        return _module("families", HERE / "make_llamafactory_families.py").make_model("intern_vl", tokenizer)
    side = 56 if model_type == "llava_next_video" else 28
    vision = tf.CLIPVisionConfig(**TINY_TEXT, image_size=side, patch_size=14, projection_dim=16)
    common = {"vision_feature_layer": -1, "vision_feature_select_strategy": "default"}
    if model_type == "llava_next_video":
        config = tf.LlavaNextVideoConfig(
            vision_config=vision,
            text_config=text,
            image_token_index=ids("<image>"),
            video_token_index=ids("<video>"),
            image_grid_pinpoints=PINPOINTS,
            spatial_pool_stride=2,
            **common,
        )
        model_class = tf.LlavaNextVideoForConditionalGeneration
    else:
        config = tf.VideoLlavaConfig(
            vision_config=vision,
            text_config=text,
            image_token_index=ids("<image>"),
            video_token_index=ids("<video>"),
            **common,
        )
        model_class = tf.VideoLlavaForConditionalGeneration
    torch.manual_seed(0)
    return model_class(config).eval()


def row_media(row: dict, folder: Path) -> tuple[list, list]:
    gen = _module("make_qwen2vl", HERE / "make_llamafactory_qwen2vl.py")
    return [gen.make_image(name) for name in row.get("images", [])], [str(folder / n) for n in row.get("videos", [])]


def messages_of(row: dict) -> list[dict]:
    return [{"role": role, "content": content} for role, content in row["messages"]]


def weights_sum(model) -> float:
    """The sum of the tiny model's weights: another transformers may draw the same seed into other weights (its
    losses are then compared on the same model, not with these)."""
    return float(sum(parameter.detach().double().sum() for parameter in model.parameters()))


def accept_images_none(video_processor) -> None:
    """LLaMA-Factory 0.9.5's BasePlugin calls a video processor as video_processor(images=None, videos=...), which
    transformers 5's video processors refuse (TypeError: VideosKwargs got an unexpected keyword argument 'images'), so
    LLaVA-NeXT-Video and Video-LLaVA videos fail there; this drops that one argument, as transformers 4's
    image-and-video processors ignored it, and leaves the rest of LLaMA-Factory's encoding as it is."""
    base = type(video_processor)

    def call(self, *args, images=None, **kwargs):
        assert images is None
        return base.__call__(self, *args, **kwargs)

    video_processor.__class__ = type(base.__name__, (base,), {"__call__": call})


def run_model(model_type: str, folder: Path, tensors: dict, metadata: dict) -> None:
    import torch
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    rows = rows_of(model_type)
    tokenizer = make_tokenizer(model_type)
    data_args = DataArguments(template=TEMPLATES[model_type], cutoff_len=CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    processor = make_processor(model_type, tokenizer)
    for key, value in SETTINGS_OF.get(model_type, SETTINGS).items():  # LLaMA-Factory's patch_processor
        setattr(processor, key, value)
    if model_type in ("llava_next_video", "video_llava"):
        accept_images_none(processor.video_processor)
    metadata[f"{model_type}.processors"] = json.dumps(
        [type(processor.image_processor).__name__, type(getattr(processor, "video_processor", None)).__name__]
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
    metadata[f"{model_type}.weights"] = repr(weights_sum(model))
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
    # A pair's pixel tensor that is its rows' joined in order is left out to keep the file small (`derived`: the rows).
    derived = {}
    for pair in range(len(features) // 2):
        head = f"{model_type}.pair.{pair}."
        for key in [key for key in tensors if key.startswith(head) and key[len(head) :].startswith("pixel_values")]:
            name = key[len(head) :]
            sides = [side for side in (2 * pair, 2 * pair + 1) if f"{model_type}.single.{side}.{name}" in tensors]
            parts = [tensors[f"{model_type}.single.{side}.{name}"] for side in sides]
            if parts and all(part.shape[1:] == tensors[key].shape[1:] for part in parts):
                if torch.equal(tensors[key], torch.cat(parts)):
                    derived[f"pair.{pair}.{name}"] = sides
                    del tensors[key]
    metadata[f"{model_type}.derived"] = json.dumps(derived)


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
