"""`lathe train` with a vision-language model (a tiny random Qwen2-VL built from a config, the PIL image processor)
against LLaMA-Factory 0.9.5 on the same folder and data (tests/llm/golden/llamafactory_qwen2vl_train.json, made by
make_llamafactory_qwen2vl_train.py): three sft steps' losses and grad norms and the trainable-parameter counts of
full tuning with the towers frozen, LoRA (tower frozen and open), the projector alone, and image-less batches
(LLaMA-Factory's stand-in image); then the data checks a user meets: rows named for a missing file, a URL, a
placeholder count, a cutoff through an image."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from tests.goldens import assert_close_to_golden  # noqa: E402
from tests.llm import multimodal_cases as cases  # noqa: E402

GOLDEN = json.loads((Path(__file__).parent / "golden" / "llamafactory_qwen2vl_train.json").read_text())


def _cases():
    import importlib.util

    path = Path(__file__).parent / "golden" / "make_llamafactory_qwen2vl_train.py"
    spec = importlib.util.spec_from_file_location("make_qwen2vl_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mm")
    return cases.make_model_folder(root / "model"), cases.make_data_folder(root / "data"), root


def _train(folders, name: str, model_type: str = "qwen2_vl", **keys):
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.stages import run_train

    model, data, root = folders
    if model_type != "qwen2_vl":
        model = root / model_type
        if not model.exists():
            cases.make_model_folder(model, model_type)

    from tests.llm.train_counts import ParameterCount

    count = ParameterCount()
    config = parse_train_config(cases.train_config(model, data, root / name, **keys))
    run_train(config, callbacks=[count])
    history = json.loads((root / name / "trainer_state.json").read_text())["log_history"]
    return [e["loss"] for e in history if "loss" in e], [e["grad_norm"] for e in history if "loss" in e], count.counts


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    ["full", "lora", "lora_open_tower", "projector_only", "no_images", "freeze_with_projector", "dpo", "kto"]
    + ["qwen2_5_vl_full", "qwen3_vl_full", "qwen3_vl_lora"],
)
def test_three_sft_steps_equal_llamafactory(folders, name):
    losses, norms, (trainable, total) = _train(folders, name, **_cases()[name])
    expected = GOLDEN[name]
    assert (trainable, total) == (expected["trainable"], expected["total"])
    # wider than the golden tolerance (tests/goldens.py): the tolerances these multimodal runs always had
    assert_close_to_golden(losses, expected["loss"], f"{name} losses", rel=0, abs=1e-5)
    assert_close_to_golden(norms, expected["grad_norm"], f"{name} norms", rel=1e-4)
    # the processor is saved beside the model, as LLaMA-Factory's SaveProcessorCallback does
    assert (folders[2] / name / "preprocessor_config.json").is_file()


def _load(folders, **keys):
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.setup import load_data

    model, data, root = folders
    config = parse_train_config(cases.train_config(model, data, root / "data-only", **keys))
    return load_data(config, stage=config.finetuning.stage)


def test_a_cutoff_through_an_image_leaves_the_row_out_counted_and_the_preview_shows_media(folders, caplog, tmp_path):
    from lathe.llm.data.preview import preview_examples

    tokenizer, _, datasets = _load(folders, cutoff_len=20, max_dropped_rows_share=1.0, overwrite_cache=True)
    reasons = " ".join(record.getMessage() for record in caplog.records)
    # LLaMA-Factory keeps these rows cut through their image tokens and then fails in the model
    assert "skipped 3 of 4 examples" in reasons and "cutoff_len cuts through media 1 of 1" in reasons
    assert "cutoff_len cuts off media 1 of 2" in reasons
    assert f"left out the row with {folders[1] / 'images' / 'wide.png'}: cutoff_len cuts" in reasons
    (row,) = datasets["train_dataset"]  # the image-less row, cut to 20 tokens
    assert row.get("images") is None and len(row["input_ids"]) == 20

    tokenizer, _, datasets = _load(folders)
    train = datasets["train_dataset"]
    assert train["images"][0] == [str(folders[1] / "images" / "wide.png")] and train["images"][3] is None
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.multimodal.collator import MultimodalCollator

    collator = MultimodalCollator(SFTDataCollator(tokenizer), datasets["media"].plugin, None)
    stale = {**train[0], "images": [str(folders[1] / "images" / "small.png")]}  # not the image it was tokenized with
    with pytest.raises(ValueError, match="holds 2 image tokens but its images make 1: an image file changed"):
        collator([stale])
    text = preview_examples(train, tokenizer, n=2)
    assert "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>Who are they?" in text
    assert "[[The quick brown fox.<|im_end|>" in text and "media images: " in text


def test_keys_the_family_lacks_and_video_rows_are_clear_errors(folders):
    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.plugins import get_plugin, plugin_class
    from lathe.llm.multimodal.qwen3_vl import Qwen3VLPlugin
    from lathe.llm.templates import TEMPLATES

    with pytest.raises(ValueError, match="image_do_pan_and_scan: the qwen2_vl family has no such option"):
        get_plugin(TEMPLATES["qwen2_vl"], None, None, MediaSettings(image_do_pan_and_scan=True))
    with pytest.raises(ValueError, match=r"crop_to_patches: the qwen2_vl family has no such option"):
        get_plugin(TEMPLATES["qwen2_vl"], None, None, MediaSettings(crop_to_patches=True))
    Qwen3VLPlugin(None, None).check_kinds({"image": 1, "video": 1}, "data.json row 2")  # Qwen3-VL takes both
    with pytest.raises(ValueError, match=r"data.json row 2: 1 video\(s\) given, but lathe's llava family takes"):
        plugin_class("llava")(None, None).check_kinds({"image": 1, "video": 1}, "data.json row 2")
    if importlib.util.find_spec("torchvision") is None:  # a user's machine has it: the video row then trains
        with pytest.raises(ValueError, match=r"^a video row needs torchvision .*pip install torchvision"):
            _load(folders, dataset="mllm_video_demo")
    with pytest.raises(ValueError, match="template 'qwen' takes no images"):
        get_plugin(TEMPLATES["qwen"], None, None)


def test_the_memory_plan_counts_the_vision_tower_only_when_it_trains(folders):
    from lathe.llm.memory.vision import vision_activation_bytes
    from lathe.llm.multimodal.towers import freeze_towers

    model = cases.make_model(cases.generator().make_tokenizer())
    args = type("Args", (), {"freeze_vision_tower": True, "freeze_multi_modal_projector": True})()
    args.freeze_language_model = False
    freeze_towers(model, args, "full")
    assert vision_activation_bytes(model, 2, 5, 4) == (
        0,
        "vision tower: 5 media tokens per row (20 patches), frozen: forward only",
    )
    args.freeze_vision_tower = False
    freeze_towers(model.requires_grad_(True), args, "full")
    kept, note = vision_activation_bytes(model, 2, 5, 4)
    # 40 patches x 1 block x (8 x 32 + 2 x 64) + the merger's 10 tokens x 2 x 32 x 4, in float32
    assert kept == (40 * 1 * (8 * 32 + 2 * 64) + 10 * 2 * 32 * 4) * 4 and note.endswith("trains")


def test_images_held_as_bytes_in_parquet_train_as_their_files(folders):
    """A parquet file whose images column is datasets' Image feature ({"bytes", "path"} per image, as LLaMA-Factory
    reads it) encodes the rows, and collates the pixels, of the same images given as files."""
    import numpy as np
    from datasets import Dataset, Features, Image, Sequence, Value

    _, data, _ = folders
    rows = json.loads((data / "mllm_demo.json").read_text())
    table = {
        "messages": [row["messages"] for row in rows],
        "images": [[{"bytes": (data / path).read_bytes(), "path": None} for path in row["images"]] for row in rows],
    }
    features = Features(
        {"messages": [{"role": Value("string"), "content": Value("string")}], "images": Sequence(Image())}
    )
    Dataset.from_dict(table, features=features).to_parquet(str(data / "mllm_bytes.parquet"))
    info = json.loads((data / "dataset_info.json").read_text())
    info["mllm_bytes"] = {**info["mllm_demo"], "file_name": "mllm_bytes.parquet"}
    (data / "dataset_info.json").write_text(json.dumps(info))
    _, _, files = _load(folders, overwrite_cache=True)
    _, _, held = _load(folders, dataset="mllm_bytes", overwrite_cache=True)
    files, held = files["train_dataset"], held["train_dataset"]
    assert held["input_ids"] == files["input_ids"] and held["labels"] == files["labels"]
    plugin = _load(folders)[2]["media"].plugin
    for index in range(len(rows)):
        ours = plugin.regularize("image", list(held[index]["images"] or []))
        theirs = plugin.regularize("image", list(files[index]["images"] or []))
        assert [np.asarray(image).tolist() for image in ours] == [np.asarray(image).tolist() for image in theirs]
