"""The families beside Qwen2-VL, token for token and tensor for tensor against LLaMA-Factory 0.9.5
(tests/llm/golden/llamafactory_families.safetensors, made by make_llamafactory_families.py with the families'
real transformers processors, PIL image backends): `<image>` / `<audio>` expansion, the encoded rows
(PaliGemma's image prefix before BOS included), and every tensor the collator returns for each row alone and
for pairs: pixel_values, image_sizes, token_type_ids, cross_attention_mask, aspect ratios, input_features,
feature_attention_mask, with LLaMA-Factory's stand-in image or audio in batches that have none; and the family's
tiny random-weight model (built from its config) takes lathe's batches."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

from tests.goldens import assert_close_to_golden  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"
# Log-mel features are log10 of FFT power: another CPU's FFT (MKL picks its kernels by the CPU) rounds each bin to
# ~1e-7 of the peak amplitude, which is ~1e-3 relative for a bin at the floor the extractors clamp to (1e-8 of the
# peak power, amplitude 1e-4): up to ~2e-4 after log10 and the /4 scaling. Not reproduced here (docs/GOLDENS.md:
# 0 difference under every kernel setting of this CPU); reported on an AVX-512 Xeon beyond the former 1e-5.
FEATURES_ABS = 1e-3


def _generator():
    spec = importlib.util.spec_from_file_location("make_families", GOLDEN_DIR / "make_llamafactory_families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.fixture(scope="module")
def golden():
    from safetensors import safe_open

    with safe_open(str(GOLDEN_DIR / "llamafactory_families.safetensors"), "pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}, f.metadata()


def golden_batch(tensors: dict, metadata: dict, family: str, batch: str) -> dict:
    """LLaMA-Factory's collated tensors of golden batch `batch` ("single.0", "pair.0", ...) of `family`."""
    head = f"{family}.{batch}."
    expected = {key[len(head) :]: value for key, value in tensors.items() if key.startswith(head)}
    for name, rows_joined in json.loads(metadata[f"{family}.derived"]).items():
        if name.startswith(head):  # left out of the file: the tensors of the pair's rows with media, joined
            key = name[len(head) :]
            expected[key] = torch.cat([tensors[f"{family}.single.{row}.{key}"] for row in rows_joined])
    return expected


def _settings(family):
    from lathe.llm.multimodal.common import MediaSettings

    return MediaSettings(**GEN.settings_of(family))


def _media(family, row):
    media = GEN.media_of(family, row)
    return media.get("images", []), media.get("audios", [])


def _plugin(family, tokenizer, processor):
    from lathe.llm.multimodal.plugins import plugin_class

    return plugin_class(GEN.plugin_of(family))(processor, tokenizer, _settings(family))


@pytest.mark.parametrize("family", list(GEN.FAMILIES))
def test_family_encodes_and_collates_as_llamafactory(family, golden):
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import EXPANDED
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tensors, metadata = golden
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    assert metadata[f"{family}.processor"].endswith(("Pil", "FeatureExtractor"))  # the goldens' PIL backend
    tokenizer = GEN.make_tokenizer(GEN.plugin_of(family))
    processor = GEN.make_processor(GEN.plugin_of(family), tokenizer)
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=GEN.FAMILIES[family][0]))
    plugin = _plugin(family, tokenizer, processor)
    media_ids = tokenizer.convert_tokens_to_ids(list(plugin.family.media_tokens(processor)))
    rows = GEN.rows_of(family)
    features = []
    for index, row in enumerate(rows):
        images, audios = _media(family, row)
        media = {kind: items for kind, items in (("image", images), ("audio", audios)) if items}
        messages = plugin.process_messages(GEN.messages_of(row), media)
        assert messages == json.loads(metadata[f"{family}.messages.{index}"]), index
        # marked as the pipeline marks them: the template refuses a literal `<image>` only in rows without media
        messages = [{**message, EXPANDED: True} for message in messages]
        ids, labels = encode_supervised_example(
            messages[:-1], messages[-1:], "", "", template, tokenizer, GEN.CUTOFF_LEN - plugin.prefix_length(media)
        )
        ids, labels = plugin.process_token_ids(ids, labels, media)
        assert ids == tensors[f"{family}.example.{index}.input_ids"].tolist(), index
        assert labels == tensors[f"{family}.example.{index}.labels"].tolist(), index
        # a cutoff through the media is named (the whole row is not), for each family's media tokens
        assert plugin.cut_reason(ids, media) is None
        if media and media_ids:
            last = max(position for position, token in enumerate(ids) if token in media_ids)
            assert plugin.cut_reason(ids[:last], media).startswith("cutoff_len cuts through the media")
        features.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)})
        features[-1].update({key: value for key, value in (("images", images), ("audios", audios)) if value})

    model = GEN.make_model(family, tokenizer)  # None for Gemma 3n: its vision tower needs timm
    # the towers' name parts (LLaMA-Factory's freeze / LoRA keys) name this model's parameters, none in two parts
    # (LLaVA-NeXT's image_newline is in none, as in LLaMA-Factory; lm_head is tied in some tiny models)
    if model is not None:
        parts = plugin.composite(model.config.model_type)
        towers = [parts.vision_keys, parts.projector_keys, parts.language_keys]
        names = [name for name, _ in model.named_parameters()]
        assert all(sum(any(key in name for key in keys) for keys in towers) <= 1 for name in names)
        for key in parts.vision_keys + parts.projector_keys + parts.language_keys[:1]:
            assert any(key in name for name in names), key
    collator = MultimodalCollator(SFTDataCollator(tokenizer, pad_to_multiple_of=8), plugin, model)
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
    for prefix, chosen in batches.items():
        batch = collator(chosen)
        expected = golden_batch(tensors, metadata, family, prefix)
        json_head = f"{family}.json.{prefix}."
        values = {
            key[len(json_head) :]: json.loads(value) for key, value in metadata.items() if key.startswith(json_head)
        }
        assert sorted(batch) == sorted([*expected, *values]), prefix
        assert all(batch[key] == value for key, value in values.items()), prefix  # non-tensors (None)
        for key, value in expected.items():
            assert batch[key].shape == value.shape and batch[key].dtype == value.dtype, (prefix, key)
            # floats (pixels) to 1e-5 absolute, as always, and the golden tolerance's relative part; audio features
            # wider (FEATURES_ABS)
            tolerance = FEATURES_ABS if key == "input_features" else 1e-5
            assert_close_to_golden(batch[key], value, f"{family} {key}, {prefix}", abs=tolerance)
        if model is not None and prefix in (
            "single.0",
            "pair.0",
        ):  # the family's tiny model takes the batch: media tokens fit its features
            with torch.no_grad():
                loss, reference = model(**batch).loss, model(**expected).loss
            assert torch.isfinite(loss) and loss.item() == pytest.approx(reference.item(), abs=1e-6), prefix


def test_gemma3_pan_and_scan_adds_a_sequence_per_crop():
    """image_do_pan_and_scan: the original image's sequence, then one per crop, and their pixel_values in that
    order. No golden: LLaMA-Factory 0.9.5 fails on any image with transformers 5 here (it reads num_crops[0][k]
    of a flat tensor); the crop count is the image processor's own."""
    from PIL import Image

    from lathe.llm.multimodal import gemma3
    from lathe.llm.multimodal.common import MediaSettings, image_processor_inputs

    tokenizer = GEN.make_tokenizer("gemma3")
    processor = GEN.make_processor("gemma3", tokenizer)
    settings = MediaSettings(image_max_pixels=1200 * 400, image_do_pan_and_scan=True)
    wide, square = Image.new("RGB", (1200, 400), (9, 99, 199)), Image.new("RGB", (40, 40))
    crops = image_processor_inputs([wide, square], processor, settings)["num_crops"].flatten().tolist()
    assert crops == [3, 0]  # 1200x400: three 400x400 crops (at least 256 a side); a small square is never cut
    messages = [{"role": "user", "content": "<image> and <image>"}, {"role": "assistant", "content": "x"}]
    content = gemma3.process_messages(messages, [wide, square], [], processor, settings)[0]["content"]
    sequence = processor.full_image_sequence
    crop_text = gemma3.PAN_AND_SCAN_TEXT.format(image=sequence)
    assert content == f"{crop_text}{sequence} {sequence} {sequence} and {crop_text}"
    batch = gemma3.media_inputs([wide, square], [], {"image": [2]}, [[1, 2]], processor, settings)
    assert batch["pixel_values"].shape == (5, 3, 28, 28) and "num_crops" not in batch


def test_pixtral_refuses_an_image_under_one_merged_block():
    """Mistral3 folds 2x2 patches into a token: an image resized under 28 pixels on a side has no token there, where
    LLaMA-Factory 0.9.5 stops with an IndexError (or the model's unfold error); lathe names the image and the fix.
    Images that reach the block expand as LLaMA-Factory's (the torchvision families golden, real processor)."""
    from types import SimpleNamespace

    import transformers
    from PIL import Image

    from lathe.llm.multimodal.common import MediaSettings
    from lathe.llm.multimodal.plugins import plugin_class

    images = transformers.PixtralImageProcessor(size={"longest_edge": 56}, patch_size=14)
    processor = SimpleNamespace(  # PixtralProcessor's attributes (it needs torchvision to be built)
        image_processor=images, patch_size=14, spatial_merge_size=2, image_break_token="B", image_end_token="E"
    )
    plugin = plugin_class("pixtral")(processor, None, MediaSettings(image_min_pixels=16 * 16))
    message = [{"role": "user", "content": "<image><image>hi"}]
    small = {"image": [Image.new("RGB", (56, 56)), Image.new("RGB", (12, 20))]}
    with pytest.raises(ValueError, match=r"image 2 of the row was resized to 28x14 pixels.*Raise image_min_pixels"):
        plugin.process_messages(message, small)
    wide = {"image": [Image.new("RGB", (56, 56)), Image.new("RGB", (56, 28))]}
    assert plugin.process_messages(message, wide)[0]["content"] == "[IMG][IMG]B[IMG][IMG]E[IMG][IMG]Ehi"


def test_media_the_family_does_not_take_is_refused():
    import numpy as np
    from PIL import Image

    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.multimodal.collator import MultimodalCollator

    row = {"input_ids": [1, 2], "labels": [-100, 2], "attention_mask": [1, 1]}
    tokenizer = GEN.make_tokenizer("qwen2_audio")
    collator = MultimodalCollator(SFTDataCollator(tokenizer), _plugin("qwen2_audio", tokenizer, None), None)
    with pytest.raises(ValueError, match="1 image.s. given, but lathe's qwen2_audio family takes no image input"):
        collator([{**row, "images": [Image.new("RGB", (8, 8))]}])
    collator = MultimodalCollator(SFTDataCollator(tokenizer), _plugin("llava", tokenizer, None), None)
    with pytest.raises(ValueError, match="lathe's llava family takes no audio input"):
        collator([{**row, "audios": [np.zeros(160)]}])
    with pytest.raises(ValueError, match="lathe's llava family takes no video input"):
        collator([{**row, "videos": ["clip.mp4"]}])
