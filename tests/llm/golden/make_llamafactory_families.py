"""Regenerate LLaMA-Factory's encoding of media rows for the families beside Qwen2-VL (LLaVA-1.5, LLaVA-NeXT,
Gemma 3, Gemma 3n, PaliGemma, Qwen2-Audio, Llama 3.2 Vision, Pixtral, InternVL) that tests/llm/test_multimodal_families.py
compares lathe against.

    python tests/llm/golden/make_llamafactory_families.py --python /tmp/mm-lf-venv/bin/python --stubs /tmp/mm-lf-stubs

Runs this same file in LLaMA-Factory 0.9.5's environment (`--worker`, where lathe is not imported). For each
family: the rows below (images drawn with PIL and numpy by make_llamafactory_qwen2vl.make_image, audio as
numpy sine waves) go through the family's LLaMA-Factory plugin and template (`process_messages`, then
`SupervisedDatasetProcessor`) with the committed BPE tokenizer (tests/llm/golden/tokenizers/bpe) plus the
family's special tokens, and through MultiModalDataCollatorForSeq2Seq (pad_to_multiple_of=8, no model: none
of these families has mrope positions). Processors are the families' real transformers classes with tiny
sizes; image processors are their PIL backends (no torchvision loads here; the metadata records the classes
and the Pillow version). Writes tests/llm/golden/llamafactory_families.safetensors: per family
`<family>.example.<i>.*`, `<family>.single.<i>.*`, `<family>.pair.<b>.*` (the dump layout of lathe data
preview --dump), `<family>.messages.<i>` in the metadata, and the versions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_families.safetensors"
TOKENIZER = HERE / "tokenizers" / "bpe"
IMAGE_MAX_PIXELS, IMAGE_MIN_PIXELS = 40 * 40, 16 * 16
CUTOFF_LEN = 1024
SAMPLING_RATE = 16000
AUDIO_SAMPLES = {"short": 3200, "long": 8000, "tone": 4800}
AUDIO_ROWS = [
    {"messages": [("user", "<audio>What is this?"), ("assistant", "The quick brown fox.")], "audios": ["short"]},
    {
        "messages": [("user", "Compare <audio> and <audio> ."), ("assistant", "Two plus two is four.")],
        "audios": ["long", "tone"],
    },
    {"messages": [("user", "What is two plus two?"), ("assistant", "Two plus two is four.")], "audios": []},
    {"messages": [("user", "<audio>hello"), ("assistant", "four")], "audios": ["tone"]},
]
FAMILIES = {  # plugin name: (template, media kind)
    "llava": ("llava", "image"),
    "llava_next": ("llava_next", "image"),
    "gemma3": ("gemma3", "image"),
    "paligemma": ("paligemma", "image"),
    "qwen2_audio": ("qwen2_audio", "audio"),
    "mllama": ("mllama", "image"),
    "pixtral": ("pixtral", "image"),
    "intern_vl": ("intern_vl", "image"),
    "intern_vl_crop": ("intern_vl", "image"),  # a family-only option, on a wide image and an image-less row
    "gemma3n": ("gemma3n", "image+audio"),
}
MIXED_ROWS = [  # Gemma 3n: an image and an audio in one row, and a row without either (both stand-ins)
    {
        "messages": [("user", "<image>What is <audio> ?"), ("assistant", "The quick brown fox.")],
        "images": ["wide"],
        "audios": ["short"],
    },
    {"messages": [("user", "What is two plus two?"), ("assistant", "four")], "images": [], "audios": []},
]
# Gemma 3's image_do_pan_and_scan has no golden: LLaMA-Factory 0.9.5 reads num_crops[0][k], which transformers 5
# returns flat (IndexError on any image); tests/llm/test_multimodal_families.py checks lathe's crops directly.
VARIANTS = {  # golden name: (plugin, the config keys it sets)
    "intern_vl_crop": ("intern_vl", {"crop_to_patches": True}),
}
WIDE_ROWS = [
    {"messages": [("user", "<image>What is this?"), ("assistant", "The quick brown fox.")], "images": ["panorama"]},
    {"messages": [("user", "hello"), ("assistant", "four")], "images": []},
]


def _qwen2vl_generator():
    spec = importlib.util.spec_from_file_location("make_qwen2vl", HERE / "make_llamafactory_qwen2vl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_QWEN2VL = _qwen2vl_generator()
_QWEN2VL.IMAGE_SIZES = {**_QWEN2VL.IMAGE_SIZES, "panorama": (600, 200)}  # this copy of the module only
ROWS = _QWEN2VL.ROWS  # the image rows: one image, two images, one image in a two-turn chat, no image
make_image, messages_of = _QWEN2VL.make_image, _QWEN2VL.messages_of


def make_audio(name: str):
    """A deterministic mono float32 waveform of AUDIO_SAMPLES[name] samples at 16 kHz: a sine plus a ramp."""
    import numpy as np

    count = AUDIO_SAMPLES[name]
    time = np.arange(count) / SAMPLING_RATE
    frequency = 220 + 40 * sum(map(ord, name)) % 500
    return (0.5 * np.sin(2 * np.pi * frequency * time) + 0.1 * time).astype("float32")


def plugin_of(family: str) -> str:
    return VARIANTS[family][0] if family in VARIANTS else family


def settings_of(family: str) -> dict:
    """The config keys of the golden: the pixel budget and audio rate, and a variant's options."""
    keys = {"image_max_pixels": IMAGE_MAX_PIXELS, "image_min_pixels": IMAGE_MIN_PIXELS}
    return {**keys, "audio_sampling_rate": SAMPLING_RATE, **(VARIANTS[family][1] if family in VARIANTS else {})}


def rows_of(family: str) -> list[dict]:
    if family == "gemma3n":
        return MIXED_ROWS
    if family in VARIANTS:
        return WIDE_ROWS
    return AUDIO_ROWS if FAMILIES[family][1] == "audio" else ROWS


def media_of(family: str, row: dict) -> dict:
    """The row's media as LLaMA-Factory's encoder and collator take them: {"images": [...]} or {"audios": [...]}."""
    if FAMILIES[family][1] == "image+audio":
        media = {"images": [make_image(name) for name in row["images"]]}
        return {**media, "audios": [make_audio(name) for name in row["audios"]]}
    if FAMILIES[family][1] == "audio":
        return {"audios": [make_audio(name) for name in row["audios"]]}
    return {"images": [make_image(name) for name in row["images"]]}


def make_tokenizer(family: str):
    """The committed BPE tokenizer with the family's special tokens (named ones where the processor reads them)."""
    from transformers import AutoTokenizer

    named, extra = {}, []
    if family in ("llava", "llava_next"):
        extra = ["<image>"]
    elif family in ("gemma3", "gemma3n"):
        named = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}
        if family == "gemma3n":
            named.update(audio_token="<audio_soft_token>", boa_token="<start_of_audio>", eoa_token="<end_of_audio>")
    elif family == "paligemma":
        extra = ["<image>"]
    elif family == "qwen2_audio":
        extra = ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]
    elif family == "mllama":
        extra = ["<|image|>", "<|python_tag|>"]
    elif family == "pixtral":
        extra = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
    elif family == "intern_vl":
        extra = ["<img>", "</img>", "<IMG_CONTEXT>"]
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER), extra_special_tokens=named) if named else None
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(TOKENIZER))
    if extra:
        tokenizer.add_special_tokens({"additional_special_tokens": extra})
    return tokenizer


def make_processor(family: str, tokenizer):
    """The family's transformers processor, tiny (28x28 tiles, 14-pixel patches, 1-second audio windows)."""
    from types import SimpleNamespace

    import transformers as tf

    if family == "llava":
        images = tf.CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
        return tf.LlavaProcessor(
            images, tokenizer, patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1
        )
    if family == "llava_next":
        images = tf.LlavaNextImageProcessor(
            size={"shortest_edge": 28},
            crop_size={"height": 28, "width": 28},
            image_grid_pinpoints=[[28, 56], [56, 28]],
        )
        return tf.LlavaNextProcessor(
            images, tokenizer, patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1
        )
    if family == "gemma3":
        images = tf.Gemma3ImageProcessor(size={"height": 28, "width": 28})
        return tf.Gemma3Processor(images, tokenizer, image_seq_length=4)
    if family == "gemma3n":  # 4 mel bins: the extractor pads every waveform to 30 seconds (3000 frames)
        features = tf.Gemma3nAudioFeatureExtractor(feature_size=4, sampling_rate=SAMPLING_RATE)
        images = tf.SiglipImageProcessor(size={"height": 28, "width": 28})
        return tf.Gemma3nProcessor(features, images, tokenizer, audio_seq_length=3, image_seq_length=4)
    if family == "paligemma":
        images = tf.SiglipImageProcessor(size={"height": 28, "width": 28})
        images.image_seq_length = 4
        return tf.PaliGemmaProcessor(images, tokenizer)
    if family == "qwen2_audio":
        features = tf.WhisperFeatureExtractor(feature_size=16, chunk_length=1, sampling_rate=SAMPLING_RATE)
        return tf.Qwen2AudioProcessor(features, tokenizer)
    if family == "mllama":
        images = tf.MllamaImageProcessor(size={"height": 28, "width": 28}, max_image_tiles=2)
        return tf.MllamaProcessor(images, tokenizer)
    # PixtralProcessor and InternVLProcessor need torchvision in transformers (InternVL's for its video
    # processor); without it, the attributes LLaMA-Factory's plugins read, beside the real image processors.
    if family == "pixtral":
        images = tf.PixtralImageProcessor(size={"longest_edge": 28}, patch_size=14)
        return SimpleNamespace(
            image_processor=images,
            tokenizer=tokenizer,
            patch_size=14,
            spatial_merge_size=1,
            image_token="[IMG]",
            image_break_token="[IMG_BREAK]",
            image_end_token="[IMG_END]",
        )
    if family == "intern_vl":
        images = tf.GotOcr2ImageProcessor(size={"height": 28, "width": 28}, max_patches=3)
        return SimpleNamespace(image_processor=images, tokenizer=tokenizer, image_seq_length=1)
    raise ValueError(family)


TINY_TEXT = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
TINY_VISION = {**TINY_TEXT, "image_size": 28, "patch_size": 14}


def make_model(family: str, tokenizer):
    """A tiny random-weight model of the family (one layer, hidden size 16) whose vision tower sees the processors'
    28x28 tiles and whose projector gives each image the token count the processor expands to."""
    import torch
    import transformers as tf

    plugin = plugin_of(family)
    if plugin == "gemma3n":  # its vision tower is a timm model (timm is not installed here)
        return None
    vocab = {"vocab_size": len(tokenizer), "num_key_value_heads": 1, "head_dim": 8}
    ids = tokenizer.convert_tokens_to_ids
    if plugin in ("llava", "llava_next", "pixtral"):
        if plugin == "pixtral":
            vision, token = tf.PixtralVisionConfig(**TINY_VISION, head_dim=8), ids("[IMG]")
        else:
            vision, token = tf.CLIPVisionConfig(**TINY_VISION, projection_dim=16), ids("<image>")
        kwargs = {"image_grid_pinpoints": [[28, 56], [56, 28]]} if plugin == "llava_next" else {}
        config_class = tf.LlavaNextConfig if plugin == "llava_next" else tf.LlavaConfig
        config = config_class(
            vision_config=vision,
            text_config=tf.LlamaConfig(**TINY_TEXT, **vocab),
            image_token_id=token,
            image_token_index=token,
            vision_feature_layer=-1,
            vision_feature_select_strategy="full" if plugin == "pixtral" else "default",
            **kwargs,
        )
        model_class = (
            tf.LlavaNextForConditionalGeneration if plugin == "llava_next" else tf.LlavaForConditionalGeneration
        )
    elif plugin == "gemma3":
        config = tf.Gemma3Config(
            text_config=tf.Gemma3TextConfig(**TINY_TEXT, **vocab),
            vision_config=tf.SiglipVisionConfig(**TINY_VISION),
            mm_tokens_per_image=4,
            image_token_index=tokenizer.image_token_id,
            boi_token_index=ids("<start_of_image>"),
            eoi_token_index=ids("<end_of_image>"),
        )
        model_class = tf.Gemma3ForConditionalGeneration
    elif plugin == "paligemma":
        config = tf.PaliGemmaConfig(
            text_config=tf.GemmaConfig(**TINY_TEXT, **vocab),
            vision_config=tf.SiglipVisionConfig(**TINY_VISION, projection_dim=16),
            projection_dim=16,
            image_token_index=ids("<image>"),
        )
        model_class = tf.PaliGemmaForConditionalGeneration
    elif plugin == "qwen2_audio":
        config = tf.Qwen2AudioConfig(
            audio_config=tf.Qwen2AudioEncoderConfig(
                num_mel_bins=16,
                d_model=16,
                encoder_layers=1,
                encoder_attention_heads=2,
                encoder_ffn_dim=32,
                max_source_positions=50,
            ),
            text_config=tf.Qwen2Config(**TINY_TEXT, **vocab),
            audio_token_index=ids("<|AUDIO|>"),
        )
        model_class = tf.Qwen2AudioForConditionalGeneration
    elif plugin == "mllama":
        config = tf.MllamaConfig(
            vision_config=tf.MllamaVisionConfig(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_global_layers=1,
                attention_heads=2,
                image_size=28,
                patch_size=14,
                max_num_tiles=2,
                intermediate_layers_indices=[0],
                vision_output_dim=32,
                supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]],
            ),
            text_config=tf.MllamaTextConfig(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=1,
                cross_attention_layers=[0],
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                vocab_size=len(tokenizer),
            ),
            image_token_index=ids("<|image|>"),
        )
        model_class = tf.MllamaForConditionalGeneration
    elif plugin == "intern_vl":
        config = tf.InternVLConfig(
            vision_config=tf.InternVLVisionConfig(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=[28, 28],
                patch_size=[14, 14],
            ),
            text_config=tf.Qwen2Config(**TINY_TEXT, **vocab),
            image_token_id=ids("<IMG_CONTEXT>"),
            downsample_ratio=0.5,
        )
        model_class = tf.InternVLForConditionalGeneration
    else:
        raise ValueError(family)
    torch.manual_seed(0)
    return model_class(config).eval()


def write_wav(path: Path, samples) -> None:
    """32-bit PCM: the float32 waveform to within 2**-31."""
    import wave

    import numpy as np

    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(4)
        handle.setframerate(SAMPLING_RATE)
        handle.writeframes(np.round(samples.astype("float64") * 2**31).astype("<i4").tobytes())


def _same_weights(model):
    """Sets every parameter from a generator seeded by its name: transformers 5.6 (LLaMA-Factory's) and 5.23
    (lathe's) initialise the same config with different draws, leave some parameters (LLaVA's projector biases) as
    uninitialised memory, and nest some models differently (Qwen2-Audio's `audio_tower` is `model.audio_tower` in
    5.23), so the name leaves out "model" and any prefix of lm_head. The training golden needs one model folder on
    both sides. Biases 0, norm weights 1, the rest normal with std 0.1."""
    import zlib

    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            key = ".".join(part for part in name.split(".") if part != "model")
            key = key[key.index("lm_head") :] if "lm_head" in key else key
            if name.endswith("bias"):
                parameter.zero_()
            elif "norm" in name.rsplit(".", 2)[-2]:
                parameter.fill_(1.0)
            else:
                generator = torch.Generator().manual_seed(zlib.crc32(key.encode()))
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


def write_folders(root: Path, family: str, fix_tokenizer) -> tuple[Path, Path, object]:
    """(model folder, data folder "rows", the model): the family's tiny model, processor and tokenizer saved, and
    its first two rows as a sharegpt dataset "rows" (images as PNG, audio as 32-bit PCM WAV), as dpo "pairs" and as "kto".
    fix_tokenizer(tokenizer, template) is lathe's or LLaMA-Factory's template fix, run before the model is built so its vocabulary holds the
    processor's and the template's tokens (the golden's order)."""
    tokenizer = make_tokenizer(family)
    processor = make_processor(family, tokenizer)
    fix_tokenizer(tokenizer, FAMILIES[family][0])
    model = _same_weights(make_model(family, tokenizer))
    folder, data = root / "model", root / "data"
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    data.mkdir(parents=True)
    rows = []
    for row in rows_of(family)[:2]:
        item = {"messages": [{"role": role, "content": content} for role, content in row["messages"]]}
        for name in row.get("images", []):
            make_image(name).save(data / f"{name}.png")
            item.setdefault("images", []).append(f"{name}.png")
        for name in row.get("audios", []):
            write_wav(data / f"{name}.wav", make_audio(name))
            item.setdefault("audios", []).append(f"{name}.wav")
        rows.append(item)
    kind = "audios" if "audios" in rows[0] else "images"
    # "pairs": the same rows for dpo, the answer chosen over "four" (the first row's answer reversed for the second)
    pairs = [{**row, "messages": row["messages"][:-1], "chosen": row["messages"][-1]} for row in rows]
    for pair in pairs:
        wrong = "four" if pair["chosen"]["content"] != "four" else "The quick brown fox."
        pair["rejected"] = {"role": "assistant", "content": wrong}
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "pairs.json").write_text(json.dumps(pairs))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    info = {"file_name": "rows.json", "formatting": "sharegpt", "columns": {"messages": "messages", kind: kind}}
    ranked = {"file_name": "pairs.json", "formatting": "sharegpt", "ranking": True}
    ranked["columns"] = {"messages": "messages", "chosen": "chosen", "rejected": "rejected", kind: kind}
    infos = {"rows": {**info, "tags": tags}, "pairs": {**ranked, "tags": tags}}
    # "kto": the rows, the first desirable and the second not
    (data / "kto.json").write_text(json.dumps([{**row, "label": index == 0} for index, row in enumerate(rows)]))
    kto = {"file_name": "kto.json", "formatting": "sharegpt", "tags": tags}
    infos["kto"] = {**kto, "columns": {"messages": "messages", "kto_tag": "label", kind: kind}}
    (data / "dataset_info.json").write_text(json.dumps(infos))
    return folder, data, model


def run_family(family: str, tensors: dict, metadata: dict) -> None:
    import torch
    from llamafactory.data.collator import MultiModalDataCollatorForSeq2Seq
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments

    tokenizer = make_tokenizer(plugin_of(family))
    processor = make_processor(plugin_of(family), tokenizer)
    data_args = DataArguments(template=FAMILIES[family][0], cutoff_len=CUTOFF_LEN)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    # LLaMA-Factory sets the media keys on the processor (patch_processor); the plugin reads them from there.
    for key, value in settings_of(family).items():
        setattr(processor, key, value)
    rows = rows_of(family)
    for index, row in enumerate(rows):
        media = media_of(family, row)
        expanded = template.mm_plugin.process_messages(
            messages_of(row), media.get("images", []), [], media.get("audios", []), processor
        )
        metadata[f"{family}.messages.{index}"] = json.dumps(expanded)
    batch = {
        "_prompt": [messages_of(row)[:-1] for row in rows],
        "_response": [messages_of(row)[-1:] for row in rows],
        "_system": [""] * len(rows),
        "_tools": [""] * len(rows),
        "_images": [media_of(family, row).get("images") or None for row in rows],
        "_videos": [None] * len(rows),
        "_audios": [media_of(family, row).get("audios") or None for row in rows],
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
            tensors[f"{family}.example.{index}.{key}"] = torch.tensor(value, dtype=torch.int64)
        feature.update(media_of(family, row))
        features.append(feature)

    def collate(prefix, chosen):
        try:
            out = collator([dict(feature) for feature in chosen])
        except Exception as error:  # recorded: lathe must fail the same batch too
            metadata[f"{family}.error.{prefix}"] = f"{type(error).__name__}: {error}"
            return
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{family}.{prefix}.{key}"] = value.detach().contiguous().clone()
            else:
                metadata[f"{family}.json.{prefix}.{key}"] = json.dumps(value, default=str)

    for index, feature in enumerate(features):
        collate(f"single.{index}", [feature])
    for pair in range(len(features) // 2):
        collate(f"pair.{pair}", features[2 * pair : 2 * pair + 2])
    # A pair's media tensor that is just its rows' tensors one after the other is left out (the file stays small):
    # the test rebuilds it from the singles' golden tensors.
    derived = {}
    for pair in range(len(features) // 2):
        with_media = [row for row in (2 * pair, 2 * pair + 1) if rows[row].get("images") or rows[row].get("audios")]
        for key in ("pixel_values", "input_features", "feature_attention_mask", "image_sizes"):
            name = f"{family}.pair.{pair}.{key}"
            parts = [tensors.get(f"{family}.single.{row}.{key}") for row in with_media]
            if name not in tensors or not parts or any(part is None for part in parts):
                continue
            if len({part.shape[1:] for part in parts}) > 1:  # padded to a common shape: kept
                continue
            if torch.equal(torch.cat(parts), tensors[name]):
                del tensors[name]
                derived[name] = with_media
    metadata[f"{family}.derived"] = json.dumps(derived)
    inner = [getattr(processor, name, None) for name in ("feature_extractor", "image_processor")]
    names = "+".join(type(part).__name__ for part in inner if part is not None)
    metadata[f"{family}.processor"] = f"{type(processor).__name__}/{names}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="/tmp/mm-lf-venv/bin/python", help="LLaMA-Factory's Python")
    parser.add_argument("--stubs", default="/tmp/mm-lf-stubs", help="the torchaudio stand-in")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated plugin names")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import llamafactory
        import PIL
        import transformers
        from safetensors.torch import save_file

        tensors, metadata = {}, {}
        for family in args.families.split(","):
            run_family(family, tensors, metadata)
        metadata["versions"] = json.dumps(
            {
                "llamafactory": llamafactory.__version__,
                "transformers": transformers.__version__,
                "pillow": PIL.__version__,
            }
        )
        save_file(tensors, str(GOLDEN), metadata=metadata)
        return
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=args.stubs,
        TRANSFORMERS_VERBOSITY="error",
        LLAMAFACTORY_VERBOSITY="ERROR",
    )
    subprocess.run([args.python, __file__, "--worker", "--families", args.families], check=True, env=env)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
