"""Qwen2-VL family images, token for token and tensor for tensor against LLaMA-Factory 0.9.5
(tests/llm/golden/llamafactory_qwen2vl.safetensors, made by make_llamafactory_qwen2vl.py with the PIL backend
of Qwen2VLImageProcessor): `<image>` expansion, the encoded rows, and the collator's pixel_values,
image_grid_thw, mrope position_ids and rope_deltas for each row alone and for pairs, the stand-in image of
a batch without images included, and the tiny model's loss on each batch; three sft steps with the vision
tower and projector frozen. Plus the row-level checks: placeholder counts, URLs, families not implemented."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

from lathe.llm.multimodal import qwen2_vl  # noqa: E402
from lathe.llm.multimodal.images import check_placeholders, open_image  # noqa: E402
from tests.goldens import assert_close_to_golden  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"


def _generator():
    spec = importlib.util.spec_from_file_location("make_qwen2vl", GOLDEN_DIR / "make_llamafactory_qwen2vl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def golden():
    from safetensors import safe_open

    with safe_open(str(GOLDEN_DIR / "llamafactory_qwen2vl.safetensors"), "pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}, f.metadata()


@pytest.fixture(scope="module")
def assets():
    from lathe.llm.config.train import DataArguments
    from lathe.llm.templates import get_template_and_fix_tokenizer

    gen = _generator()
    tokenizer = gen.make_tokenizer()
    get_template_and_fix_tokenizer(tokenizer, DataArguments(template="qwen2_vl"))  # its pad token, in any test order
    return gen, tokenizer, gen.make_image_processor(), gen.make_model(tokenizer)


def _expanded(gen, image_processor, row):
    images = [gen.make_image(name) for name in row["images"]]
    inputs = qwen2_vl.image_inputs(images, image_processor, gen.IMAGE_MAX_PIXELS, gen.IMAGE_MIN_PIXELS)
    grid = inputs.get("image_grid_thw", [])
    return qwen2_vl.expand_placeholders(gen.messages_of(row), grid, image_processor.merge_size)


def test_image_placeholders_expand_as_llamafactory(golden, assets):
    gen, _, image_processor, _ = assets
    _, metadata = golden
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    assert metadata["image_processor"] == "Qwen2VLImageProcessorPil"
    for index, row in enumerate(gen.ROWS):
        assert _expanded(gen, image_processor, row) == json.loads(metadata[f"messages.{index}"]), index
    first = json.loads(metadata["messages.0"])[0]["content"]
    assert first.startswith("<|vision_start|>" + "<|image_pad|>" * 2) and "<|vision_end|>What is this?" in first


def test_rows_encode_as_llamafactory(golden, assets):
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.templates import get_template_and_fix_tokenizer

    gen, tokenizer, image_processor, _ = assets
    tensors, _ = golden
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="qwen2_vl"))
    for index, row in enumerate(gen.ROWS):
        messages = _expanded(gen, image_processor, row)
        ids, labels = encode_supervised_example(
            messages[:-1], messages[-1:], "", "", template, tokenizer, gen.CUTOFF_LEN
        )
        assert ids == tensors[f"example.{index}.input_ids"].tolist(), index
        assert labels == tensors[f"example.{index}.labels"].tolist(), index


def test_collator_tensors_match_llamafactory_for_rows_and_pairs(golden, assets):
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.multimodal.collator import Qwen2VLCollator

    gen, tokenizer, image_processor, model = assets
    import PIL

    tensors, metadata = golden
    same_pillow = json.loads(metadata["versions"])["pillow"] == PIL.__version__
    collator = Qwen2VLCollator(
        SFTDataCollator(tokenizer, model=model, pad_to_multiple_of=8),
        image_processor,
        model,
        gen.IMAGE_MAX_PIXELS,
        gen.IMAGE_MIN_PIXELS,
    )
    features = [
        {
            **{key: tensors[f"example.{index}.{key}"].tolist() for key in ("input_ids", "labels", "attention_mask")},
            "images": [gen.make_image(name) for name in row["images"]],
        }
        for index, row in enumerate(gen.ROWS)
    ]
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
    for prefix, chosen in batches.items():
        batch = collator(chosen)
        expected = {key.split(".", 2)[2]: value for key, value in tensors.items() if key.startswith(prefix + ".")}
        if prefix.startswith("pair."):  # left out of the golden: the rows' images in order (checked there)
            expected["pixel_values"] = torch.cat(
                [collator([feature])["pixel_values"] for feature in chosen if feature["images"]]
            )
        assert sorted(batch) == sorted(expected), prefix
        for key, value in expected.items():
            assert batch[key].shape == value.shape, (prefix, key)
            # resampling of another Pillow differs by a level of 255 here and there; integers are exact
            tolerance = {} if same_pillow or key != "pixel_values" else {"abs": 0.05}
            assert_close_to_golden(batch[key], value, f"qwen2vl {key}, {prefix}", **tolerance)
        with torch.no_grad():  # the same tiny model reads lathe's batch as it read LLaMA-Factory's
            loss = model(**batch).loss.item()
        golden_loss = tensors[f"loss.{prefix}"].item()
        assert_close_to_golden(loss, golden_loss, f"qwen2vl loss, {prefix}", abs=1e-5 if same_pillow else 1e-3)
    # the image-less row got LLaMA-Factory's stand-in: 64x64 white, attended to by nothing, never trained
    alone = collator([features[3]])
    stand_in = alone["attention_mask"][0, len(features[3]["input_ids"]) :]
    assert stand_in.sum() == 0 and alone["labels"][0, len(features[3]["input_ids"]) :].eq(-100).all()
    assert alone["image_grid_thw"].tolist() == [[1, 2, 2]]  # 64x64 fitted into image_max_pixels 40*40


def test_image_sides_and_aspect_as_the_family_needs():
    from PIL import Image

    # 400 pixels scaled up to image_min_pixels (32*32: 16x64), then sides of at least 28; RGB
    assert qwen2_vl.prepare_image(Image.new("L", (10, 40))).size == (28, 64)
    assert qwen2_vl.prepare_image(Image.new("L", (10, 40))).mode == "RGB"
    assert qwen2_vl.prepare_image(Image.new("RGB", (2000, 1000)), max_pixels=100 * 100).size == (141, 70)
    assert qwen2_vl.prepare_image(Image.new("RGB", (6000, 28)), max_pixels=10**6).size == (28 * 180, 28)


def test_row_checks_name_the_row(tmp_path):
    from PIL import Image

    from lathe.llm.multimodal.plugins import plugin_module

    messages = [{"role": "user", "content": "<image><image> what?"}, {"role": "assistant", "content": "x"}]
    with pytest.raises(ValueError, match=r"data.json row 3: 1 image\(s\) given but the messages hold 2 <image>"):
        check_placeholders(messages, {"image": 1}, "data.json row 3")
    check_placeholders(messages, {"image": 2}, "data.json row 3")
    with pytest.raises(ValueError, match="data.json row 2: 'https://x/a.png' is a URL; lathe reads no network"):
        open_image("https://x/a.png", str(tmp_path), "data.json row 2")
    with pytest.raises(FileNotFoundError, match="data.json row 2: image file .*missing.png' not found"):
        open_image("missing.png", str(tmp_path), "data.json row 2")
    Image.new("RGB", (5, 4)).save(tmp_path / "a.png")
    assert open_image("a.png", str(tmp_path)).size == (5, 4)  # relative to media_dir
    assert plugin_module("qwen2_vl") is qwen2_vl
    with pytest.raises(ValueError, match=r"template 'next_vl' \(multimodal family 'next_vl'\): image, video and audio"):
        plugin_module("next_vl", "next_vl")  # a family lathe does not know (all of LLaMA-Factory 0.9.5's are known)


def test_three_sft_steps_train_the_language_model_only(assets, tmp_path):
    """Full sft as LLaMA-Factory runs it by default (vision tower and projector frozen): image rows and an
    image-less row (the stand-in image) train, the frozen parts stay bit-identical, the rest moves."""
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.collator import Qwen2VLCollator
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.train import Trainer, TrainingArguments

    gen, tokenizer, image_processor, _ = assets
    model = gen.make_model(tokenizer).train()
    trainable = qwen2_vl.freeze_for_full_tuning(model, qwen2_vl.frozen_keys())
    language = sum(p.numel() for n, p in model.named_parameters() if "language_model" in n or "lm_head" in n)
    assert trainable == language and 0 < trainable < sum(p.numel() for p in model.parameters())
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "visual" in n}
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if "language_model.layers.0." in n}

    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="qwen2_vl"))  # sets the pad token
    rows = []
    for row in gen.ROWS:
        messages = _expanded(gen, image_processor, row)
        ids, labels = encode_supervised_example(messages[:-1], messages[-1:], "", "", template, tokenizer, 1024)
        images = [gen.make_image(name) for name in row["images"]]
        rows.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids), "images": images})
    collator = Qwen2VLCollator(
        SFTDataCollator(tokenizer, model=model, pad_to_multiple_of=8),
        image_processor,
        model,
        gen.IMAGE_MAX_PIXELS,
        gen.IMAGE_MIN_PIXELS,
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        remove_unused_columns=False,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows[1:] + rows[:1], data_collator=collator)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses)
    for name, value in frozen.items():
        assert torch.equal(dict(model.named_parameters())[name], value), name
    assert any(not torch.equal(dict(model.named_parameters())[n], v) for n, v in trained.items())


def test_a_cutoff_through_an_image_run_is_named_never_trained():
    from lathe.llm.multimodal.images import media_cut_reason

    start, end, pad = 7, 8, 9
    row = [1, start, pad, pad, pad, end, 2, start, pad, end, 3]
    assert media_cut_reason(row, start, end, pad, [3, 1]) is None
    assert (
        media_cut_reason(row[:9], start, end, pad, [3, 1]) == "cutoff_len cuts through media 2 of 2 (1 of its 1 tokens)"
    )
    assert (
        media_cut_reason(row[:4], start, end, pad, [3, 1]) == "cutoff_len cuts through media 1 of 2 (2 of its 3 tokens)"
    )
    assert media_cut_reason(row[:6], start, end, pad, [3, 1]) == "cutoff_len cuts off media 2 of 2 (its 1 tokens)"


def test_lora_never_targets_the_frozen_towers_or_the_patch_embedding(assets):
    _, _, _, model = assets
    targets = ["q_proj", "v_proj", "qkv", "proj", "mlp.0"]
    default = qwen2_vl.lora_module_names(model, targets, qwen2_vl.frozen_keys())
    assert default and all("language_model" in name for name in default)
    assert "model.language_model.layers.0.self_attn.q_proj" in default
    open_tower = qwen2_vl.lora_module_names(model, targets, qwen2_vl.frozen_keys(freeze_vision_tower=False))
    assert "model.visual.blocks.0.attn.qkv" in open_tower and "model.visual.blocks.0.attn.proj" in open_tower
    assert not [name for name in open_tower if "patch_embed" in name or "merger" in name]
    everything = qwen2_vl.lora_module_names(
        model, targets, qwen2_vl.frozen_keys(freeze_vision_tower=False, freeze_multi_modal_projector=False)
    )
    assert "model.visual.merger.mlp.0" in everything and not [name for name in everything if "patch_embed" in name]
