"""Regenerate LLaMA-Factory 0.9.5's encodings and three-step trainings of the families whose transformers processors
need torchvision: Llama 4 and LFM2-VL images (Llama4Processor, Lfm2VlProcessor); Pixtral as Mistral-Small 3.x
(Mistral3ForConditionalGeneration, mistral_small template) and as Pixtral-12B (LLaVA with a Pixtral tower, pixtral
template) through PixtralProcessor; InternVL through InternVLProcessor (images, crop_to_patches, and a video row
trained); and record how it fails on GLM-4.1V and ERNIE-4.5-VL video rows (Glm4vVideoProcessor,
Ernie4_5_VLMoeVideoProcessor). tests/llm/test_multimodal_torchvision_families.py compares lathe.

    python tests/llm/golden/make_llamafactory_torchvision_families.py [--python bench/.venv-lf/bin/python]

Runs this same file in LLaMA-Factory's environment (`--worker`; lathe is not imported there) with torchvision
through the test recipe (tests/llm/torchvision_recipe.py), the torchaudio stand-in and Pillow 12.3 first on the path
(`--pillow`, as make_llamafactory_mrope_families.py: the Pillow lathe's environment has). The processors are the real
transformers classes at tiny sizes (make_processor), the models tiny (one layer, hidden 16) with every weight set by a
generator seeded by its name (make_llamafactory_families._same_weights), so both sides hold one model. Per model type:
its rows (rows_of) through LLaMA-Factory's plugin and template (`process_messages`, `SupervisedDatasetProcessor`) and
MultiModalDataCollatorForSeq2Seq (pad_to_multiple_of=8, with the model) for each row alone and for pairs, the model's
loss on each batch; then LLaMA-Factory's `run_exp` for three steps of one batch of the first two rows (CASES). Writes
llamafactory_torchvision_families.safetensors (`<model>.example.<i>.*`, `<model>.single.<i>.*`, `<model>.pair.<b>.*`
(less the pixel tensors that are their rows' joined: `<model>.derived`), `<model>.loss.<batch>`; messages, versions
and the training results as JSON in the metadata). Where LLaMA-Factory stops, the error instead: `<model>.video_error`
(its first video row as it is), `<model>.error` (after the video processor's images=None argument is dropped).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "llamafactory_torchvision_families.safetensors"
TEMPLATES = {
    "llama4": "llama4",
    "lfm2_vl": "lfm2_vl",
    "glm4v": "glm4v",
    "ernie_vl": "ernie_vl",
    "pixtral": "mistral_small",  # Mistral-Small 3.x: Mistral3ForConditionalGeneration (LLaMA-Factory's mistral3)
    "pixtral_llava": "pixtral",  # Pixtral-12B: LlavaForConditionalGeneration with a Pixtral vision tower
    "intern_vl": "intern_vl",
    "intern_vl_crop": "intern_vl",  # crop_to_patches on a wide image and an image-less row
}
MODELS = tuple(TEMPLATES)
TEMPLATES["intern_vl_video"] = "intern_vl"  # InternVL on the video golden's rows: trained only (CASES)
TOKENS = {  # the family's special tokens added to the committed BPE tokenizer
    "llama4": ["<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>", "<|tile_x_separator|>"]
    + ["<|tile_y_separator|>"],
    "lfm2_vl": ["<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"],
    "glm4v": ["<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>"]
    + ["<|video|>"],
    "ernie_vl": ["<|IMAGE_START|>", "<|IMAGE_END|>", "<|IMAGE_PLACEHOLDER|>", "<|VIDEO_START|>", "<|VIDEO_END|>"]
    + ["<|VIDEO_PLACEHOLDER|>"],
    "pixtral": ["[IMG]", "[IMG_BREAK]", "[IMG_END]"],
}
SETTINGS = {  # the processor keys LLaMA-Factory's patch_processor sets
    "image_max_pixels": 40 * 40,
    "image_min_pixels": 16 * 16,
    "video_max_pixels": 32 * 32,
    "video_min_pixels": 16 * 16,
    "video_fps": 2.0,
    "video_maxlen": 4,
}
# Mistral3 (transformers 5.6) fails on an image one patch high or wide (its patch merger folds 2x2 patches) and on a
# batch whose images give one merged token in all (get_image_features squeezes that token's dimension away): Pixtral's
# images are fitted to 56x56 to 64x64 pixels here (2 to 4 tokens each), as a real folder's larger budget avoids both
SETTINGS_OF = {
    "pixtral": {**SETTINGS, "image_min_pixels": 56 * 56, "image_max_pixels": 64 * 64},
    "intern_vl_crop": {**SETTINGS, "crop_to_patches": True},
}
CUTOFF_LEN = 1024
# ERNIE-4.5-VL's video processor draws each frame's time on it with the checkpoint's font file (Roboto-Regular.ttf,
# beside the weights; none offline here): a system font in its place, the same file on both sides
FONT = "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf"
LORA = {"finetuning_type": "lora", "lora_target": "all", "lora_rank": 4, "learning_rate": 0.05}
CASES = {  # case -> (model type, keys over train_config); full tuning keeps LLaMA-Factory's default frozen tower
    "llama4_full": ("llama4", {}),
    "llama4_lora": ("llama4", LORA),
    "lfm2_vl_full": ("lfm2_vl", {}),
    "lfm2_vl_lora": ("lfm2_vl", LORA),
    "pixtral_full": ("pixtral", {}),
    "pixtral_lora": ("pixtral", LORA),
    "pixtral_llava_full": ("pixtral_llava", {}),
    "pixtral_llava_lora": ("pixtral_llava", LORA),
    "intern_vl_full": ("intern_vl", {}),
    "intern_vl_lora": ("intern_vl", LORA),
    "intern_vl_video_full": ("intern_vl_video", {}),  # an image and a video in one row, then a text-only row
}


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAMILIES = _module("make_families", HERE / "make_llamafactory_families.py")
VIDEO = _module("make_video", HERE / "make_llamafactory_video.py")
make_image, messages_of = FAMILIES.make_image, FAMILIES.messages_of


def rows_of(model_type: str) -> list[dict]:
    """The families golden's image rows (one image, two, a two-turn chat, none); the video golden's for the video
    families (a video; an image and a video; text only; two videos in two turns), InternVL's in its order (no video
    before an image)."""
    if model_type == "intern_vl_video":
        return VIDEO.INTERN_ROWS
    if model_type == "intern_vl_crop":
        return FAMILIES.WIDE_ROWS
    return VIDEO.ROWS if model_type in ("glm4v", "ernie_vl") else FAMILIES.ROWS


def make_tokenizer(model_type: str):
    from transformers import AutoTokenizer

    if model_type == "ernie_vl":  # Ernie4_5_VLMoeProcessor reads its tokens by name from the tokenizer
        kinds = ("image_start", "image_end", "image", "video_start", "video_end", "video")
        named = {f"{kind}_token": token for kind, token in zip(kinds, TOKENS[model_type])}
        return AutoTokenizer.from_pretrained(str(FAMILIES.TOKENIZER), extra_special_tokens=named)
    if model_type.startswith("intern_vl"):
        return AutoTokenizer.from_pretrained(str(FAMILIES.TOKENIZER), extra_special_tokens=VIDEO.INTERN_TOKENS)
    tokenizer = AutoTokenizer.from_pretrained(str(FAMILIES.TOKENIZER))
    tokenizer.add_special_tokens({"additional_special_tokens": TOKENS[model_type.removesuffix("_llava")]})
    return tokenizer


def make_processor(model_type: str, tokenizer):
    """The model type's transformers processor at tiny sizes (as a model folder's AutoProcessor builds it where
    torchvision imports): 28-pixel Llama 4 tiles of 14-pixel patches (one `<|patch|>` per tile after the 2x2 pixel
    shuffle); LFM2-VL's 16-pixel patches, 2x downsample, 2 to 8 image tokens; GLM-4.1V's and ERNIE-4.5-VL's image and
    video processors with 14-pixel patches and small pixel budgets."""
    import transformers as tf

    if model_type == "llama4":
        images = tf.Llama4ImageProcessor(size={"height": 28, "width": 28}, max_patches=4)
        return tf.Llama4Processor(images, tokenizer, patch_size=14, pixel_shuffle_ratio=0.5)
    if model_type == "lfm2_vl":
        images = tf.Lfm2VlImageProcessor(min_image_tokens=2, max_image_tokens=8, tile_size=64, encoder_patch_size=16)
        return tf.Lfm2VlProcessor(images, tokenizer)
    if model_type == "pixtral":  # as Mistral-Small 3.1's folder: 14-pixel patches merged 2x2 by the model
        images = tf.PixtralImageProcessor(size={"longest_edge": 56}, patch_size=14)
        return tf.PixtralProcessor(images, tokenizer, patch_size=14, spatial_merge_size=2)
    if model_type == "pixtral_llava":  # the families golden's sizes: the 28-pixel tower's 2x2 rope grid
        images = tf.PixtralImageProcessor(size={"longest_edge": 28}, patch_size=14)
        return tf.PixtralProcessor(images, tokenizer, patch_size=14)
    if model_type.startswith("intern_vl"):  # the video golden's InternVLProcessor
        return VIDEO.make_processor("intern_vl", tokenizer)
    budget = {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 16}
    if model_type == "glm4v":
        images = tf.Glm4vImageProcessor(size=budget)
        videos = tf.Glm4vVideoProcessor(size={"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 8})
        return tf.Glm4vProcessor(images, tokenizer, videos)
    images = tf.Ernie4_5_VLMoeImageProcessor(size=budget)
    videos = tf.Ernie4_5_VLMoeVideoProcessor(size={"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 8}, font=FONT)
    return tf.Ernie4_5_VLMoeProcessor(images, tokenizer, videos)


TINY = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}


def make_model(model_type: str, tokenizer):
    """A tiny model of the type (one layer, hidden 16), every weight set by name (both transformers agree)."""
    import transformers as tf

    ids = tokenizer.convert_tokens_to_ids
    vocab = {"vocab_size": len(tokenizer), "num_key_value_heads": 1}
    if model_type == "llama4":
        vision = tf.Llama4VisionConfig(  # intermediate 64: the 2x2 pixel shuffle's width, which the adapter takes
            **{**TINY, "intermediate_size": 64},
            image_size=28,
            patch_size=14,
            vision_output_dim=16,
            projector_input_dim=16,
            projector_output_dim=16,
            pixel_shuffle_ratio=0.5,
        )
        text = tf.Llama4TextConfig(
            **TINY, **vocab, head_dim=8, intermediate_size_mlp=32, num_local_experts=2, attention_chunk_size=1024
        )
        config = tf.Llama4Config(
            vision_config=vision,
            text_config=text,
            image_token_index=ids("<|patch|>"),  # as Llama 4's config: the features replace the patch tokens
            boi_token_index=ids("<|image_start|>"),
            eoi_token_index=ids("<|image_end|>"),
        )
        model = tf.Llama4ForConditionalGeneration(config)
    elif model_type == "pixtral":
        vision = tf.PixtralVisionConfig(**TINY, head_dim=8, image_size=56, patch_size=14)
        text = tf.MistralConfig(**TINY, **vocab, head_dim=8)
        config = tf.Mistral3Config(
            vision_config=vision, text_config=text, image_token_index=ids("[IMG]"), spatial_merge_size=2
        )
        model = tf.Mistral3ForConditionalGeneration(config)
    elif model_type.startswith("intern_vl") or model_type == "pixtral_llava":  # the families golden's tiny models
        family = "pixtral" if model_type == "pixtral_llava" else "intern_vl"
        return FAMILIES._same_weights(FAMILIES.make_model(family, tokenizer)).eval()
    elif model_type == "lfm2_vl":
        vision = tf.Siglip2VisionConfig(**TINY, patch_size=16, num_patches=16)
        text = tf.Lfm2Config(**TINY, **vocab, layer_types=["full_attention"])
        config = tf.Lfm2VlConfig(
            vision_config=vision, text_config=text, image_token_id=ids("<image>"), projector_hidden_size=16
        )
        model = tf.Lfm2VlForConditionalGeneration(config)
    else:
        return _mrope_model(model_type, tokenizer)
    return FAMILIES._same_weights(model).eval()


def _mrope_model(model_type: str, tokenizer):
    """The mrope families golden's tiny GLM-4.1V / ERNIE-4.5-VL, with the video tokens of this tokenizer."""
    mrope = _module("make_mrope", HERE / "make_llamafactory_mrope_families.py")
    return FAMILIES._same_weights(mrope.make_model(model_type, tokenizer))


def make_model_of(model_type: str, tokenizer):
    import torch

    torch.manual_seed(0)
    return make_model(model_type, tokenizer)


def weights_sum(model) -> float:
    return float(sum(parameter.detach().double().sum() for parameter in model.parameters()))


def as_float32(batch: dict) -> dict:
    """The batch with Llama 4's bfloat16 pixel_values (its image processor normalizes in bfloat16) as float32, for
    the float32 tiny model's loss (its vision tower refuses a bfloat16 input against float32 weights)."""
    import torch

    return {k: v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 else v for k, v in batch.items()}


def row_media(row: dict, folder: Path) -> tuple[list, list]:
    """(images, video paths) of a row."""
    return [make_image(name) for name in row.get("images", [])], [str(folder / n) for n in row.get("videos", [])]


def bridge_video_processor(model_type: str, processor, rows: list, folder: Path, template, metadata: dict) -> None:
    """LLaMA-Factory 0.9.5 calls the video processor with images=None, which transformers 5's video processors may
    refuse (make_llamafactory_video.accept_images_none): the error its first video row stops with is recorded
    (`<model>.video_error`), then that one argument is dropped (`<model>.bridged`) and the rest of its encoding is
    tried (where it still fails: `<model>.error`)."""
    row = next(row for row in rows if row.get("videos"))
    try:
        template.mm_plugin.process_messages(messages_of(row), *row_media(row, folder), [], processor)
    except Exception as error:  # noqa: BLE001 (recorded for the docs and the test)
        metadata[f"{model_type}.video_error"] = f"{type(error).__name__}: {error}"
        VIDEO.accept_images_none(processor.video_processor)
        metadata[f"{model_type}.bridged"] = "video_processor(images=None) dropped"


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
    if getattr(processor, "video_processor", None) is not None and any(row.get("videos") for row in rows):
        bridge_video_processor(model_type, processor, rows, folder, template, metadata)
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
    model = make_model_of(model_type, tokenizer)
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
            tensors[f"{model_type}.loss.{prefix}"] = model(**as_float32(out)).loss.detach().reshape(1).float()
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
            name, sides = key[len(head) :], [2 * pair, 2 * pair + 1]
            parts = [tensors.get(f"{model_type}.single.{side}.{name}") for side in sides]
            if all(part is not None and part.shape[1:] == tensors[key].shape[1:] for part in parts):
                if torch.equal(tensors[key], torch.cat(parts)):
                    derived[f"pair.{pair}.{name}"] = sides
                    del tensors[key]
    metadata[f"{model_type}.derived"] = json.dumps(derived)


def write_folders(root: Path, model_type: str, fix_tokenizer) -> tuple[Path, Path]:
    """(model folder, data folder): the tiny model, its processor and tokenizer saved, and the type's first two rows
    as dataset "rows" (images as PNG, videos made with PyAV). fix_tokenizer(tokenizer, template) is lathe's or
    LLaMA-Factory's template fix, run before the model is built (the vocabulary it sizes)."""
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.media_files import write_video_files

    tokenizer = make_tokenizer(model_type)
    fix_tokenizer(tokenizer, TEMPLATES[model_type])
    processor = make_processor(model_type, tokenizer)
    model, data = root / model_type / "model", root / model_type / "data"
    make_model_of(model_type, tokenizer).save_pretrained(str(model))
    processor.save_pretrained(str(model))
    data.mkdir(parents=True, exist_ok=True)
    if any(row.get("videos") for row in rows_of(model_type)[:2]):
        write_video_files(data)
    rows = []
    for row in rows_of(model_type)[:2]:
        item = {"messages": [{"role": role, "content": content} for role, content in row["messages"]]}
        for name in row.get("images", []):
            make_image(name).save(data / f"{name}.png")
            item.setdefault("images", []).append(f"{name}.png")
        if row.get("videos"):
            item["videos"] = list(row["videos"])
        rows.append(item)
    (data / "rows.json").write_text(json.dumps(rows))
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    columns = {"messages": "messages"}  # a column no row has fails in LLaMA-Factory's converter (KeyError)
    columns.update({kind: kind for kind in ("images", "videos") if any(kind in item for item in rows)})
    info = {"rows": {"file_name": "rows.json", "formatting": "sharegpt", "columns": columns, "tags": tags}}
    (data / "dataset_info.json").write_text(json.dumps(info))
    return model, data


def train_config(model_type: str, model: Path, data: Path, output: Path, **keys) -> dict:
    """Three steps of one batch of both rows, on CPU, with this golden's media settings."""
    return {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "rows",
        "dataset_dir": str(data),
        "template": TEMPLATES[model_type],
        "cutoff_len": CUTOFF_LEN,
        **SETTINGS_OF.get(model_type, SETTINGS),
        "output_dir": str(output),
        "overwrite_output_dir": True,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1.0e-2,
        "max_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 42,
        "use_cpu": True,
        "preprocessing_num_workers": None,
        "dataloader_num_workers": 0,
        **keys,
    }


def run_training(root: Path) -> dict:
    """LLaMA-Factory's run_exp on each case: logged losses and grad norms, trainable and total parameter counts."""
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    class Count(TrainerCallback):
        counts = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen = {id(p): p for p in model.parameters()}.values()
            self.counts = [sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen)]

    results, folders = {}, {}
    for name, (model_type, keys) in CASES.items():
        if model_type not in folders:
            folders[model_type] = write_folders(root, model_type, fix_tokenizer)
        config = train_config(model_type, *folders[model_type], root / name, **keys)
        for key in ("use_cpu", "dataloader_num_workers", "preprocessing_num_workers"):
            config.pop(key)
        config.update(bf16=False, fp16=False, plot_loss=False)
        count = Count()
        try:
            run_exp(config, callbacks=[count])
        except Exception as error:  # recorded: the docs say what lathe does instead
            traceback.print_exc()
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            continue
        history = json.loads((root / name / "trainer_state.json").read_text())["log_history"]
        results[name] = {
            "loss": [entry["loss"] for entry in history if "loss" in entry],
            "grad_norm": [entry["grad_norm"] for entry in history if "grad_norm" in entry],
            "trainable": count.counts[0],
            "total": count.counts[1],
        }
    return results


def run_llamafactory(folder: Path, models: list[str], train: bool) -> tuple[dict, dict]:
    import av
    import llamafactory
    import PIL
    import torchvision
    import transformers

    tensors, metadata = {}, {}
    for model_type in models:
        try:
            run_model(model_type, folder, tensors, metadata)
        except Exception as error:  # recorded: where LLaMA-Factory itself stops (the test checks lathe's answer)
            traceback.print_exc()
            for key in [key for key in tensors if key.startswith(f"{model_type}.")]:
                del tensors[key]
            metadata[f"{model_type}.error"] = f"{type(error).__name__}: {error}"
    if train:
        with tempfile.TemporaryDirectory() as root:
            metadata["train"] = json.dumps(run_training(Path(root)))
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
    parser.add_argument("--pillow", default=str(HERE.parents[2] / "bench/.cache/pillow12"), help="Pillow 12.3")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model types")
    parser.add_argument("--no-train", action="store_true", help="skip the run_exp cases")
    parser.add_argument("--out", default=str(GOLDEN), help=argparse.SUPPRESS)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        from safetensors.torch import save_file

        tensors, metadata = run_llamafactory(Path(args.worker), args.models.split(","), not args.no_train)
        save_file(tensors, args.out, metadata=metadata)
        return
    sys.path.insert(0, str(HERE.parents[2]))
    from tests.llm.torchvision_recipe import torchvision_paths

    shim, site = torchvision_paths()
    with tempfile.TemporaryDirectory() as scratch:
        _module("media_files", HERE.parent / "media_files.py").write_video_files(Path(scratch))
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
        command = [args.python, __file__, "--worker", scratch, "--models", args.models, "--out", args.out]
        subprocess.run(command + (["--no-train"] if args.no_train else []), check=True, env=env)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
