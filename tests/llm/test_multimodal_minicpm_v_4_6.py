"""MiniCPM-V 4.6 (minicpm_v_4_6 template) against LLaMA-Factory 0.9.5's own plugin, run under transformers 5.23
(tests/llm/golden/llamafactory_minicpm_v_4_6.safetensors, made by make_llamafactory_minicpm_v_4_6.py with the real
MiniCPMV4_6Processor: LLaMA-Factory's venv, transformers 5.6, has no minicpmv4_6): the image and slice runs with
their image ids, the encoded rows, and every collated value (pixel_values, target_sizes, grids,
num_patches_per_image, downsample_mode; the stand-in image in the image-less row) for each row alone and for pairs;
the tiny model's loss on lathe's batch equals its loss on LLaMA-Factory's. lathe loads the image processor alone (no
torchvision here), the tokens from the tokenizer's names."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")
transformers = pytest.importorskip("transformers")

HERE = Path(__file__).parent
if not hasattr(transformers, "MiniCPMV4_6ImageProcessorPil"):
    pytest.skip("transformers has no MiniCPM-V 4.6 (5.23 and later)", allow_module_level=True)


def _generator():
    path = HERE / "golden" / "make_llamafactory_minicpm_v_4_6.py"
    spec = importlib.util.spec_from_file_location("make_minicpm_v_4_6", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MINICPM = _generator()
BASE = MINICPM.BASE  # the families generator's rows, images and cutoff
NAME = "minicpm_v_4_6"


def test_minicpm_v_4_6_encodes_and_collates_as_llamafactory():
    from safetensors import safe_open

    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.common import MediaSettings
    from lathe.llm.multimodal.encode import EXPANDED
    from lathe.llm.multimodal.plugins import get_plugin
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from tests.goldens import assert_close_to_golden
    from tests.llm.test_multimodal_families import golden_batch

    with safe_open(str(MINICPM.GOLDEN), "pt") as handle:
        tensors, metadata = {key: handle.get_tensor(key) for key in handle.keys()}, handle.metadata()
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    tokenizer = MINICPM.make_tokenizer()
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=NAME))
    settings = {"image_max_pixels": BASE.IMAGE_MAX_PIXELS, "image_min_pixels": BASE.IMAGE_MIN_PIXELS}
    plugin = get_plugin(template, MINICPM.make_image_processor(), tokenizer, MediaSettings(**settings))
    features = []
    for index, row in enumerate(BASE.ROWS):
        images = plugin.regularize("image", [BASE.make_image(name) for name in row["images"]], "a row")
        media = {"image": images} if images else {}
        messages = plugin.process_messages(BASE.messages_of(row), media)
        assert messages == json.loads(metadata[f"{NAME}.messages.{index}"]), index
        messages = [{**message, EXPANDED: True} for message in messages]
        ids, labels = encode_supervised_example(messages[:-1], messages[-1:], "", "", template, tokenizer, 1024)
        assert ids == tensors[f"{NAME}.example.{index}.input_ids"].tolist(), index
        assert labels == tensors[f"{NAME}.example.{index}.labels"].tolist(), index
        if images:  # a cutoff through the last image run is named
            assert plugin.cut_reason(ids, media) is None
            end = tokenizer.convert_tokens_to_ids("</image>")
            last = max(position for position, token in enumerate(ids) if token == end)
            assert plugin.cut_reason(ids[:last], media).startswith("cutoff_len cuts through the media")
        features.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids), "images": images})
    model = MINICPM.make_model(tokenizer)
    parts = plugin.composite(model.config.model_type)  # LLaMA-Factory's keys name this model's parts
    names = [name for name, _ in model.named_parameters()]
    for key in parts.vision_keys + parts.projector_keys + parts.language_keys:
        assert any(key in name for name in names), key
    collator = MultimodalCollator(SFTDataCollator(tokenizer, pad_to_multiple_of=8), plugin, model)
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(2)})
    for name, chosen in batches.items():
        batch, expected = collator([dict(feature) for feature in chosen]), golden_batch(tensors, metadata, NAME, name)
        head = f"{NAME}.json.{name}."
        values = {key[len(head) :]: json.loads(value) for key, value in metadata.items() if key.startswith(head)}
        assert sorted(batch) == sorted([*expected, *values]), name
        assert all(batch[key] == value for key, value in values.items()), name  # grids, counts, downsample_mode
        for key, value in expected.items():
            assert_close_to_golden(batch[key], value, f"{NAME} {key}, {name}", abs=1e-5)
        if name in ("single.1", "pair.0"):  # the model takes the batch: its image tokens fit the features
            with torch.no_grad():
                loss, reference = model(**batch).loss, model(**expected, **values).loss
            assert torch.isfinite(loss) and loss.item() == pytest.approx(reference.item(), abs=1e-6), name


def test_minicpm_v_4_6_refuses_video_and_other_processors():
    from lathe.llm.multimodal.common import MediaSettings
    from lathe.llm.multimodal.minicpm_v_4_6 import MiniCPMV46Plugin

    tokenizer = MINICPM.make_tokenizer()
    plugin = MiniCPMV46Plugin(MINICPM.make_image_processor(), tokenizer, MediaSettings())
    with pytest.raises(ValueError, match="minicpm_v_4_6 family takes no video input: LLaMA-Factory 0.9.5's"):
        plugin.check_kinds({"video": 1}, "a row")
    with pytest.raises(ValueError, match="needs MiniCPM-V 4.6's image processor"):
        MiniCPMV46Plugin(transformers.CLIPImageProcessor(), tokenizer, MediaSettings())


def _train_generator():
    path = HERE / "golden" / "make_llamafactory_minicpm_v_4_6_train.py"
    spec = importlib.util.spec_from_file_location("make_minicpm_v_4_6_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRAIN = _train_generator()
TRAIN_GOLDEN = json.loads(TRAIN.GOLDEN.read_text())


@pytest.mark.parametrize("case", list(TRAIN.CASES))
def test_lathe_train_three_steps_equal_llamafactory(case, tmp_path):
    """Three sft steps of the tiny MiniCPMV4_6ForConditionalGeneration on two image rows, full (vision tower and
    merger frozen: LLaMA-Factory's registration) and LoRA (rank 4, all): LLaMA-Factory 0.9.5's run_exp under
    transformers 5.23 (make_llamafactory_minicpm_v_4_6_train.py) gives the same losses (1e-5), grad norms (1e-4
    relative) and trainable / total counts."""
    from lathe.llm.config.train import DataArguments, parse_train_config
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.workflows.stages import run_train
    from tests.goldens import assert_close_to_golden

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    from tests.llm.train_counts import ParameterCount

    expected = TRAIN_GOLDEN[case]
    model, data = TRAIN.write_folders(tmp_path, fix_tokenizer)
    count = ParameterCount()
    run_train(
        parse_train_config(TRAIN.train_config(model, data, tmp_path / "out", **TRAIN.CASES[case])), callbacks=[count]
    )
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert count.counts == (expected["trainable"], expected["total"])
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert_close_to_golden(losses, expected["loss"], f"{case} losses", rel=0, abs=1e-5)
    norms = [entry["grad_norm"] for entry in history if "loss" in entry]
    assert_close_to_golden(norms, expected["grad_norm"], f"{case} norms", rel=1e-4)
