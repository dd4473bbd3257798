"""lathe's video rows against LLaMA-Factory's (tests/llm/golden/llamafactory_video.safetensors), run where
torchvision imports: by tests/llm/test_multimodal_video.py in a subprocess with the torchvision test recipe.
check(folder) compares, per model type, the expanded messages, the encoded rows, and every collated tensor of each
row alone and of pairs (integers exactly, floats to a tolerance), and the tiny model's loss on each batch."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).parent


def _module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _module("make_video", HERE / "golden" / "make_llamafactory_video.py")


MEDIA_TOKENS = {  # each family's vision tokens (the last of a row's media runs is one of them)
    "qwen2_vl": ["<|image_pad|>", "<|video_pad|>", "<|vision_end|>"],
    "qwen3_vl": ["<|image_pad|>", "<|video_pad|>", "<|vision_end|>"],
    "llava_next_video": ["<image>", "<video>"],
    "video_llava": ["<image>", "<video>"],
    "intern_vl": ["<img>", "<IMG_CONTEXT>", "</img>"],
}


def golden(path: Path = HERE / "golden" / "llamafactory_video.safetensors"):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}, handle.metadata()


def check(folder: Path, models=None, gen=GEN, media_tokens=None) -> list[str]:
    """`gen`: the golden's generator module (its GOLDEN file, make_* functions, rows and settings); media_tokens:
    each family's vision tokens (MEDIA_TOKENS)."""
    import torch

    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import EXPANDED
    from lathe.llm.multimodal.plugins import plugin_class
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from tests.goldens import assert_close_to_golden

    float_inputs = getattr(gen, "as_float32", dict)  # the golden's model is float32 (Llama 4's pixels are bfloat16)
    tensors, metadata = golden(gen.GOLDEN)
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    checked, media_tokens = [], media_tokens or MEDIA_TOKENS
    for model_type in models or gen.MODELS:
        tokenizer = gen.make_tokenizer(model_type)
        template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=gen.TEMPLATES[model_type]))
        processor = gen.make_processor(model_type, tokenizer)
        assert json.loads(metadata[f"{model_type}.processors"]) == [
            type(processor.image_processor).__name__,
            type(getattr(processor, "video_processor", None)).__name__,
        ]
        settings = MediaSettings(**gen.SETTINGS_OF.get(model_type, gen.SETTINGS))
        plugin = plugin_class(template.multimodal)(processor, tokenizer, settings)
        rows = gen.rows_of(model_type)
        model = gen.make_model(model_type, tokenizer)
        media_ids = set(tokenizer.convert_tokens_to_ids(media_tokens[template.multimodal]))
        parts = plugin.composite(model.config.model_type)  # the towers' name parts name this model's parameters
        names = [name for name, _ in model.named_parameters()]
        keys = [] if parts is None else parts.vision_keys + parts.projector_keys + parts.language_keys[:1]
        for key in keys:
            assert any(key in name for name in names), (model_type, key)
        features = []
        for index, row in enumerate(rows):
            images, videos = gen.row_media(row, folder)
            media = {}
            if images:
                media["image"] = plugin.regularize("image", images)
            if videos:
                media["video"] = plugin.regularize("video", videos)
            messages = plugin.process_messages(gen.messages_of(row), media)
            expected = json.loads(metadata[f"{model_type}.messages.{index}"])
            assert messages == expected, (model_type, index)
            messages = [{**message, EXPANDED: True} for message in messages]  # as the pipeline marks them
            ids, labels = encode_supervised_example(messages[:-1], messages[-1:], "", "", template, tokenizer, 1024)
            prefix = f"{model_type}.example.{index}"
            assert ids == tensors[f"{prefix}.input_ids"].tolist(), (model_type, index)
            assert labels == tensors[f"{prefix}.labels"].tolist(), (model_type, index)
            if media:  # whole, the row trains; cut before its last media token, the cut is named
                assert plugin.cut_reason(ids, media) is None, (model_type, index)
                last = max(at for at, token in enumerate(ids) if token in media_ids)
                assert plugin.cut_reason(ids[:last], media).startswith("cutoff_len cuts through"), (model_type, index)
            features.append(
                {
                    "input_ids": ids,
                    "labels": labels,
                    "attention_mask": [1] * len(ids),
                    "images": images,
                    "videos": videos,
                }
            )
        collator = MultimodalCollator(SFTDataCollator(tokenizer, model=model, pad_to_multiple_of=8), plugin, model)
        batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
        batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
        for prefix, chosen in batches.items():
            batch = collator([dict(feature) for feature in chosen])
            head = f"{model_type}.{prefix}."
            expected = {key[len(head) :]: value for key, value in tensors.items() if key.startswith(head)}
            for name, sides in json.loads(metadata.get(f"{model_type}.derived", "{}")).items():
                if name.startswith(prefix + "."):  # left out of the golden: the rows' pixel tensors in order
                    key = name[len(prefix) + 1 :]
                    expected[key] = torch.cat([tensors[f"{model_type}.single.{side}.{key}"] for side in sides])
            second = metadata.get(f"{model_type}.json.{prefix}.second_per_grid_ts")
            if second is not None:
                expected["second_per_grid_ts"] = json.loads(second)
            metadata_json = metadata.get(f"{model_type}.json.{prefix}.video_metadata")
            if metadata_json is not None:  # Qwen3-VL's processor metadata: no model input, left out of lathe's batch
                videos = [plugin.regularize("video", feature["videos"]) for feature in chosen if feature["videos"]]
                for item in plugin.video_metadata([video for row in videos for video in row]):
                    described = f"total_num_frames={item['total_num_frames']}, fps={item['fps']}"
                    assert described in metadata_json and f"duration={item['duration']}" in metadata_json, prefix
            assert sorted(batch) == sorted(expected), (model_type, prefix, sorted(batch), sorted(expected))
            for key, value in expected.items():
                ours = batch[key]
                if not isinstance(value, torch.Tensor):
                    assert ours == value, (model_type, prefix, key)
                elif value.is_floating_point():
                    # pixels to 1e-5 absolute, as the families' goldens, and the golden tolerance's relative part
                    assert ours.shape == value.shape and ours.dtype == value.dtype, (model_type, prefix, key)
                    assert_close_to_golden(ours, value, f"video golden {model_type} {prefix} {key}", abs=1e-5)
                else:
                    assert torch.equal(ours, value), (model_type, prefix, key)
            with torch.no_grad():
                loss = model(**float_inputs(batch)).loss.item()
                # LLaMA-Factory's loss where this transformers draws its weights; else its batch on this model
                same = abs(gen.weights_sum(model) - float(metadata[f"{model_type}.weights"])) < 1e-6
                reference = (
                    tensors[f"{model_type}.loss.{prefix}"].item()
                    if same
                    else model(**float_inputs(expected)).loss.item()
                )
            assert_close_to_golden(loss, reference, f"video golden {model_type} {prefix} loss (same weights: {same})")
            checked.append(f"{model_type}.{prefix}")
    return checked


def main(folder: str, models=None) -> None:
    print(json.dumps(check(Path(folder), models)))


def torchvision_checks(folder: str, root: str) -> None:
    """check(folder), train(root / "train"), pipeline(root / "pipeline"), serving(folder, root / "serving") and
    packing(folder) in one process (one start of torch, transformers and torchvision for the tests that read them):
    prints {"check": ..., "train": ..., "pipeline": ..., "serving": ..., "packing": ...}, each its result or the
    traceback that stopped it."""
    import traceback

    parts = {
        "check": lambda: check(Path(folder)),
        "train": lambda: train(str(Path(root) / "train")),
        "pipeline": lambda: pipeline(str(Path(root) / "pipeline")),
        "serving": lambda: serving(folder, str(Path(root) / "serving")),
        "packing": lambda: packing(folder),
    }
    out = {}
    for part, run in parts.items():
        try:
            out[part] = run()
        except Exception:  # noqa: BLE001 (reported to the test that reads this part)
            out[part] = {"error": traceback.format_exc()}
    print(json.dumps(out))


def packing(folder: str) -> dict:
    """Video rows (a video; an image and a video; two videos in two turns) neat-packed into one row against each row
    alone (test_multimodal_packing._packed_against_alone), per model type: the packed loss, the token-weighted mean
    of the rows' own, and how many examples got their own mrope positions (Qwen2.5-VL: second_per_grid_ts sliced per
    example; the LLaVA video families have none)."""
    from lathe.llm.multimodal.base import MediaSettings
    from tests.llm.test_multimodal_packing import _packed_against_alone

    def media_of(row):
        images, videos = GEN.row_media(row, Path(folder))
        return {"images": images, "videos": videos}

    results = {}
    for model_type in ("qwen2_5_vl", "llava_next_video", "video_llava"):
        tokenizer = GEN.make_tokenizer(model_type)
        packed, alone, same_positions = _packed_against_alone(
            tokenizer,
            GEN.TEMPLATES[model_type],
            GEN.make_processor(model_type, tokenizer),
            MediaSettings(**GEN.SETTINGS_OF.get(model_type, GEN.SETTINGS)),
            GEN.make_model(model_type, tokenizer),
            [
                GEN.ROWS[index] for index in (0, 1, 3)
            ],  # (a text row alone gets the stand-in image: not its packed tokens)
            media_of,
            ("images", "videos"),
        )
        results[model_type] = {"packed": packed, "alone": alone, "same_positions": same_positions}
    return results


def serving(folder: str, root: str) -> dict:
    """A video served by lathe api / lathe chat / the web chat (video_serving_check.py)."""
    from tests.llm.video_serving_check import serving_checks

    return serving_checks(folder, root)


def pipeline(root: str) -> dict:
    """LLaMA-Factory's mllm_video_demo shape beside the image demo through lathe's whole data pipeline (the model
    folder's AutoProcessor, built with its video processor where torchvision imports), one collated batch of a
    video row and an image row, and the tiny model's loss on it."""
    import torch

    from lathe.llm.config.train import parse_train_config
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.workflows.setup import load_data
    from tests.llm import multimodal_cases as cases

    root = Path(root)
    model, data = cases.make_model_folder(root / "model"), cases.make_data_folder(root / "data")
    config = parse_train_config(cases.train_config(model, data, root / "out", dataset="mllm_video_demo,mllm_demo"))
    tokenizer, _, datasets = load_data(config, stage="sft")
    rows = [dict(row) for row in datasets["train_dataset"]]
    net = cases.make_model(tokenizer)
    batch = MultimodalCollator(SFTDataCollator(tokenizer, model=net), datasets["media"].plugin, net)(rows[:2])
    with torch.no_grad():
        loss = net(**batch).loss.item()
    pads = int((batch["input_ids"] == tokenizer.convert_tokens_to_ids("<|video_pad|>")).sum())
    return {"rows": len(rows), "videos": rows[0].get("videos"), "keys": sorted(batch), "loss": loss, "pads": pads}


def train(root: str, gen=None) -> dict:
    """`lathe train` on make_llamafactory_video_train.py's folders and cases: per case the logged losses and grad
    norms and the trainable and total parameter counts (what tests/llm/golden/llamafactory_video_train.json holds)."""
    from lathe.llm.config.train import DataArguments, parse_train_config
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.workflows.stages import run_train

    gen = gen or _module("make_video_train", HERE / "golden" / "make_llamafactory_video_train.py")

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    from tests.llm.train_counts import ParameterCount

    results, folders = {}, {}
    for name, (model_type, keys) in gen.CASES.items():
        if model_type not in folders:
            folders[model_type] = gen.write_folders(Path(root), model_type, fix_tokenizer)
        count, output = ParameterCount(), Path(root) / name
        config = gen.train_config(model_type, *folders[model_type], output, **keys)
        run_train(parse_train_config(config), callbacks=[count])
        history = json.loads((output / "trainer_state.json").read_text())["log_history"]
        results[name] = {
            "loss": [entry["loss"] for entry in history if "loss" in entry],
            "grad_norm": [entry["grad_norm"] for entry in history if "loss" in entry],
            "trainable": count.counts[0],
            "total": count.counts[1],
        }
    return results
