"""Regenerate LLaMA-Factory's encoding of media rows for the families with 3-D rotary positions beside Qwen2-VL:
GLM-4.1V (glm4v) and Qwen2.5-Omni / Qwen3-Omni (qwen2_omni: images and audio), that
tests/llm/test_multimodal_mrope_families.py compares lathe against.

    python tests/llm/golden/make_llamafactory_mrope_families.py [--python bench/.venv-lf/bin/python]

Runs this same file in LLaMA-Factory 0.9.5's environment (`--worker`, where lathe is not imported), as
make_llamafactory_families.py does (its images, audio, BPE tokenizer and collation reused): each family's rows go
through its LLaMA-Factory plugin and template, then MultiModalDataCollatorForSeq2Seq (pad_to_multiple_of=8) WITH the
family's tiny random model, whose get_rope_index makes the position_ids and rope_deltas. transformers builds
Glm4vProcessor and the Omni processors only with a video processor (torchvision, which does not load beside the CPU
torch here), so the plugins get the attributes they read (image_processor, feature_extractor) beside the real PIL
image processors and Whisper feature extractor; "qwen3_omni" is a stand-in whose class is named
Qwen3OmniMoeProcessor (LLaMA-Factory counts Qwen3-Omni's audio tokens by that name). Writes
tests/llm/golden/llamafactory_mrope_families.safetensors (layout of llamafactory_families.safetensors).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_mrope_families.safetensors"
FAMILIES = {  # golden name: (template, media kinds)
    "glm4v": ("glm4v", "image"),
    "qwen2_omni": ("qwen2_omni", "image+audio"),
    "qwen3_omni": ("qwen3_omni_nothink", "image+audio"),
    "ernie_vl": ("ernie_vl", "image"),
    # videos with their own audio interleaved (use_audio_in_video), and the same rows with the two apart
    "qwen2_omni_video": ("qwen2_omni", "image+audio+video"),
    "qwen2_omni_video_apart": ("qwen2_omni", "image+audio+video"),
}
# Qwen3-Omni's video rows (the qwen3_omni templates' tokens, the Qwen3-Omni thinker), recorded with the real
# Qwen3OmniMoeProcessor only (make_llamafactory_omni_video.py): not in this stand-in golden
REAL_PROCESSOR_FAMILIES = {
    "qwen3_omni_video": ("qwen3_omni_nothink", "image+audio+video"),
    "qwen3_omni_video_apart": ("qwen3_omni_nothink", "image+audio+video"),
}
VIDEO_SETTINGS = {"video_max_pixels": 32 * 32, "video_min_pixels": 16 * 16, "video_fps": 2.0, "video_maxlen": 128}
VIDEO_ROWS = [  # each video followed by its audio; the image-less, video-less row gets both stand-ins
    {
        "messages": [("user", "<video><audio>What happens?"), ("assistant", "The quick brown fox.")],
        "videos": ["walk.mp4"],
        "audios": ["short"],
    },
    {
        "messages": [("user", "<image>Is this in <video><audio> ?"), ("assistant", "Two plus two is four.")],
        "images": ["wide"],
        "videos": ["spin.mp4"],
        "audios": ["long"],
    },
    {"messages": [("user", "What is two plus two?"), ("assistant", "four")]},
    {"messages": [("user", "<audio>hello"), ("assistant", "four")], "audios": ["tone"]},
]
OMNI_ROWS = [  # an image and an audio in one row, audio alone, neither (both stand-ins), two images
    {
        "messages": [("user", "<image>What is <audio> ?"), ("assistant", "The quick brown fox.")],
        "images": ["wide"],
        "audios": ["short"],
    },
    {"messages": [("user", "<audio>hello"), ("assistant", "four")], "images": [], "audios": ["long"]},
    {"messages": [("user", "What is two plus two?"), ("assistant", "four")], "images": [], "audios": []},
    {
        "messages": [("user", "Compare <image> and <image> ."), ("assistant", "Two plus two is four.")],
        "images": ["small", "large"],
        "audios": [],
    },
]
TOKENS = {
    "ernie_vl": ["<|IMAGE_PLACEHOLDER|>", "<|IMAGE_START|>", "<|IMAGE_END|>", "<|VIDEO_PLACEHOLDER|>"]
    + ["<|VIDEO_START|>", "<|VIDEO_END|>"],
    "glm4v": ["<|image|>", "<|begin_of_image|>", "<|end_of_image|>", "<|video|>"],
    "qwen2_omni": ["<|IMAGE|>", "<|VIDEO|>", "<|AUDIO|>", "<|vision_bos|>", "<|vision_eos|>"]
    + ["<|audio_bos|>", "<|audio_eos|>"],
    "qwen3_omni": ["<|image_pad|>", "<|video_pad|>", "<|audio_pad|>", "<|vision_start|>", "<|vision_end|>"]
    + ["<|audio_start|>", "<|audio_end|>"],
}


def _families_generator():
    spec = importlib.util.spec_from_file_location("make_families", HERE / "make_llamafactory_families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = _families_generator()
make_image, make_audio, messages_of, CUTOFF_LEN = BASE.make_image, BASE.make_audio, BASE.messages_of, BASE.CUTOFF_LEN


def spec_of(family: str) -> tuple[str, str]:
    """(template, media kinds) of a golden name of either generator."""
    return {**FAMILIES, **REAL_PROCESSOR_FAMILIES}[family]


def is_video(family: str) -> bool:
    return family.startswith(("qwen2_omni_video", "qwen3_omni_video"))


def settings_of(family: str) -> dict:
    settings = {
        "image_max_pixels": BASE.IMAGE_MAX_PIXELS,
        "image_min_pixels": BASE.IMAGE_MIN_PIXELS,
        "audio_sampling_rate": BASE.SAMPLING_RATE,
    }
    if is_video(family):
        settings.update(VIDEO_SETTINGS, use_audio_in_video=not family.endswith("_apart"))
    return settings


def rows_of(family: str) -> list[dict]:
    if is_video(family):
        return VIDEO_ROWS
    return BASE.ROWS if family in ("glm4v", "ernie_vl") else OMNI_ROWS


def media_of(family: str, row: dict, video_folder: Path | None = None) -> dict:
    """The row's media as LLaMA-Factory takes them: images and audio as objects, videos as file paths in
    video_folder (media_files.write_video_files)."""
    media = {"images": [make_image(name) for name in row.get("images", [])]}
    if "audio" in spec_of(family)[1]:
        media["audios"] = [make_audio(name) for name in row.get("audios", [])]
    if "video" in spec_of(family)[1]:
        media["videos"] = [str(Path(video_folder) / name) for name in row.get("videos", [])]
    return media


def media_files():
    spec = importlib.util.spec_from_file_location("media_files", HERE.parent / "media_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OmniStandInVideoProcessor:
    """A deterministic stand-in for Qwen2VLVideoProcessor (which needs torchvision, not loadable here): each video's
    frames (an even count) resized to multiples of 28 pixels, cut into 2-frame x 14x14 patches (one row of
    3 * 2 * 14 * 14 values each), with video_grid_thw (frame pairs, patch rows, patch columns)."""

    patch_size, merge_size, temporal_patch_size = 14, 2, 2

    def __call__(self, videos, return_tensors="pt", **kwargs):
        import numpy as np
        import torch

        rows, grids = [], []
        for frames in videos:
            width, height = (max(28, 28 * round(side / 28)) for side in frames[0].size)
            array = np.stack([np.asarray(frame.convert("RGB").resize((width, height))) for frame in frames])
            pixels = torch.from_numpy(array.astype("float32") / 255.0).permute(0, 3, 1, 2)
            t, h, w = len(frames) // 2, height // 14, width // 14
            patches = pixels.reshape(t, 2, 3, h, 14, w, 14).permute(0, 3, 5, 2, 1, 4, 6).reshape(t * h * w, -1)
            rows.append(patches)
            grids.append([t, h, w])
        return {"pixel_values_videos": torch.cat(rows), "video_grid_thw": torch.tensor(grids)}


class OmniStandInProcessor:
    """The attributes LLaMA-Factory's Qwen2OmniPlugin reads (the Omni processors need torchvision to be built):
    the real image processor and feature extractor, the stand-in video processor, and transformers' own
    Qwen2_5OmniProcessor.get_chunked_index for use_audio_in_video."""

    def __init__(self, **parts):
        self.__dict__.update(parts)

    def get_chunked_index(self, token_indices, tokens_per_chunk):
        from transformers import Qwen2_5OmniProcessor

        return Qwen2_5OmniProcessor.get_chunked_index(self, token_indices, tokens_per_chunk)


def tokens_of(family: str) -> list[str]:
    """The family's special tokens (the video variants: their model's)."""
    return TOKENS[next((name for name in ("qwen2_omni", "qwen3_omni") if family.startswith(name)), family)]


def make_tokenizer(family: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(BASE.TOKENIZER))
    tokenizer.add_special_tokens({"additional_special_tokens": tokens_of(family)})
    return tokenizer


def make_processor(family: str, tokenizer):
    """The attributes LLaMA-Factory's plugin reads: the real PIL image processor (14-pixel patches merged 2x2,
    at most 56x56 pixels) and, for the Omni models, Whisper's feature extractor (16 mel bins, 1-second window)."""
    from types import SimpleNamespace

    import transformers as tf

    size = {"shortest_edge": 28 * 28, "longest_edge": 56 * 56}
    kwargs = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "size": size}
    if family == "glm4v":
        return SimpleNamespace(image_processor=tf.Glm4vImageProcessorPil(**kwargs), tokenizer=tokenizer)
    if family == "ernie_vl":
        images = tf.Ernie4_5_VLMoeImageProcessorPil(patch_size=14, merge_size=2, size=size)
        return SimpleNamespace(image_processor=images, tokenizer=tokenizer)
    images = tf.Qwen2VLImageProcessorPil(**kwargs)
    features = tf.WhisperFeatureExtractor(feature_size=16, chunk_length=1, sampling_rate=BASE.SAMPLING_RATE)
    parts = {"image_processor": images, "feature_extractor": features, "tokenizer": tokenizer}
    if family == "qwen3_omni":
        return type("Qwen3OmniMoeProcessor", (SimpleNamespace,), {})(**parts)
    if family.startswith("qwen2_omni_video"):
        return OmniStandInProcessor(**parts, video_processor=OmniStandInVideoProcessor())
    return SimpleNamespace(**parts)


TINY_TEXT = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}


def make_model(family: str, tokenizer):
    """The family's tiny random model (one layer, hidden size 16): its get_rope_index makes the positions, and its
    forward takes the batches (a 2x2-merged patch per image token; an audio token per encoder frame)."""
    import torch
    import transformers as tf

    ids = tokenizer.convert_tokens_to_ids
    text = {**TINY_TEXT, "vocab_size": len(tokenizer), "num_key_value_heads": 1, "head_dim": 8}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 16}
    vision.update(patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    if family == "glm4v":
        text["rope_parameters"] = {"rope_type": "default", "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5}
        text["head_dim"] = 16  # half of it rotates (partial_rotary_factor): 4 frequencies in mrope_section
        config = tf.Glm4vConfig(
            text_config=tf.Glm4vTextConfig(**text),
            vision_config=tf.Glm4vVisionConfig(**vision, image_size=28),
            image_token_id=ids("<|image|>"),
            video_token_id=ids("<|video|>"),
            image_start_token_id=ids("<|begin_of_image|>"),
            image_end_token_id=ids("<|end_of_image|>"),
        )
        model_class = tf.Glm4vForConditionalGeneration
    elif family == "ernie_vl":
        text.update(moe_intermediate_size=[16, 16], moe_k=1, moe_num_experts=2, moe_num_shared_experts=0)
        text.update(mlp_layer_types=["dense"], rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2]})
        ernie_vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2}
        ernie_vision.update(patch_size=14, spatial_merge_size=2, temporal_merge_size=2)
        config = tf.Ernie4_5_VLMoeConfig(
            text_config=tf.Ernie4_5_VLMoeTextConfig(**text),
            vision_config=tf.Ernie4_5_VLMoeVisionConfig(**ernie_vision),
            image_token_id=ids("<|IMAGE_PLACEHOLDER|>"),
            image_start_token_id=ids("<|IMAGE_START|>"),
            image_end_token_id=ids("<|IMAGE_END|>"),
            video_token_id=ids("<|VIDEO_PLACEHOLDER|>"),
            video_start_token_id=ids("<|VIDEO_START|>"),
            video_end_token_id=ids("<|VIDEO_END|>"),
        )
        model_class = tf.Ernie4_5_VLMoeForConditionalGeneration
    elif family.startswith("qwen2_omni"):
        text["rope_parameters"] = {"rope_type": "default", "mrope_section": [2, 1, 1]}
        audio = {"num_mel_bins": 16, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 32}
        audio.update(d_model=16, output_dim=16, max_source_positions=50, n_window=50)
        config = tf.Qwen2_5OmniThinkerConfig(
            text_config=tf.Qwen2_5OmniTextConfig(**text),
            vision_config=tf.Qwen2_5OmniVisionEncoderConfig(**vision, fullatt_block_indexes=[0], window_size=56),
            audio_config=tf.Qwen2_5OmniAudioEncoderConfig(**audio),
            image_token_index=ids("<|IMAGE|>"),
            video_token_index=ids("<|VIDEO|>"),
            audio_token_index=ids("<|AUDIO|>"),
            vision_start_token_id=ids("<|vision_bos|>"),
            audio_start_token_id=ids("<|audio_bos|>"),
            audio_end_token_id=ids("<|audio_eos|>"),
        )
        model_class = tf.Qwen2_5OmniThinkerForConditionalGeneration
    elif family.startswith("qwen3_omni"):
        text.update(rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1]}, num_experts=2)
        text.update(num_experts_per_tok=1, moe_intermediate_size=16)
        audio = {"num_mel_bins": 16, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 32}
        audio.update(d_model=16, output_dim=16, max_source_positions=50, n_window=50, downsample_hidden_size=8)
        vision.update(num_position_embeddings=16, deepstack_visual_indexes=[0])
        config = tf.Qwen3OmniMoeThinkerConfig(
            text_config=tf.Qwen3OmniMoeTextConfig(**text),
            vision_config=tf.Qwen3OmniMoeVisionEncoderConfig(**vision),
            audio_config=tf.Qwen3OmniMoeAudioEncoderConfig(**audio),
            image_token_id=ids("<|image_pad|>"),
            video_token_id=ids("<|video_pad|>"),
            audio_token_id=ids("<|audio_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"),
            audio_start_token_id=ids("<|audio_start|>"),
        )
        model_class = tf.Qwen3OmniMoeThinkerForConditionalGeneration
    else:
        raise ValueError(family)
    torch.manual_seed(0)
    return model_class(config).eval()


def run_family(family: str, tensors: dict, metadata: dict, video_folder: Path | None = None) -> None:
    import torch
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    tokenizer = make_tokenizer(family)
    processor = make_processor(family, tokenizer)
    data_args = DataArguments(template=spec_of(family)[0], cutoff_len=CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    for key, value in settings_of(family).items():
        setattr(processor, key, value)
    rows = rows_of(family)
    for index, row in enumerate(rows):
        media = media_of(family, row, video_folder)
        expanded = template.mm_plugin.process_messages(
            messages_of(row), media.get("images", []), media.get("videos", []), media.get("audios", []), processor
        )
        metadata[f"{family}.messages.{index}"] = json.dumps(expanded)
    batch = {
        "_prompt": [messages_of(row)[:-1] for row in rows],
        "_response": [messages_of(row)[-1:] for row in rows],
        "_system": [""] * len(rows),
        "_tools": [""] * len(rows),
        "_images": [media_of(family, row, video_folder).get("images") or None for row in rows],
        "_videos": [media_of(family, row, video_folder).get("videos") or None for row in rows],
        "_audios": [media_of(family, row, video_folder).get("audios") or None for row in rows],
    }
    encoder = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
    )
    encoded = encoder.preprocess_dataset(batch)
    model = make_model(family, tokenizer)
    collator = MultiModalDataCollatorForSeq2Seq(
        template=template, processor=processor, model=model, tokenizer=tokenizer, pad_to_multiple_of=8
    )
    features = []
    for index, row in enumerate(rows):
        feature = {key: encoded[key][index] for key in ("input_ids", "labels", "attention_mask")}
        for key, value in feature.items():
            tensors[f"{family}.example.{index}.{key}"] = torch.tensor(value, dtype=torch.int64)
        feature.update({key: value for key, value in media_of(family, row, video_folder).items() if value})
        features.append(feature)

    def collate(prefix, chosen):
        out = collator([dict(feature) for feature in chosen])
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{family}.{prefix}.{key}"] = value.detach().contiguous().clone()
            else:
                metadata[f"{family}.json.{prefix}.{key}"] = json.dumps(value, default=str)

    for index, feature in enumerate(features):
        collate(f"single.{index}", [feature])
    for pair in range(len(features) // 2):
        collate(f"pair.{pair}", features[2 * pair : 2 * pair + 2])
    # A pair's media tensor that is just its rows' single tensors one after the other is left out (a smaller file):
    # the test joins the singles' golden tensors again.
    derived = {}
    for pair in range(len(features) // 2):
        for key in ("pixel_values", "pixel_values_videos", "input_features", "feature_attention_mask"):
            name = f"{family}.pair.{pair}.{key}"
            parts = [tensors.get(f"{family}.single.{row}.{key}") for row in (2 * pair, 2 * pair + 1)]
            rows = [2 * pair + index for index, part in enumerate(parts) if part is not None]
            if name in tensors and rows and torch.equal(torch.cat([p for p in parts if p is not None]), tensors[name]):
                del tensors[name]
                derived[name] = rows
    metadata[f"{family}.derived"] = json.dumps(derived)
    inner = [getattr(processor, name, None) for name in ("feature_extractor", "image_processor")]
    metadata[f"{family}.processor"] = "+".join(type(part).__name__ for part in inner if part is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="bench/.venv-lf/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="bench/lf_stubs", help="the torchaudio stand-in")
    parser.add_argument(
        "--pillow",
        default="bench/.cache/pillow12",
        help="a folder with Pillow 12.3 (the goldens' and lathe's: Pillow 13 resizes a few pixels one unit apart), "
        "e.g. a copy of lathe's site-packages/PIL, pillow.libs and its dist-info",
    )
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated golden names")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import tempfile

        import llamafactory
        import PIL
        import transformers
        from safetensors.torch import save_file

        tensors, metadata = {}, {}
        with tempfile.TemporaryDirectory() as folder:
            import hashlib

            for name, path in media_files().write_video_files(Path(folder)).items():
                metadata[f"sha256.{name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
            for family in args.families.split(","):
                run_family(family, tensors, metadata, Path(folder))
        versions = {"llamafactory": llamafactory.__version__, "transformers": transformers.__version__}
        metadata["versions"] = json.dumps({**versions, "pillow": PIL.__version__})
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(os.path.abspath(path) for path in (args.pillow, args.stubs) if os.path.isdir(path)),
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
    )
    subprocess.run([args.python, __file__, "--worker", "--families", args.families], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
