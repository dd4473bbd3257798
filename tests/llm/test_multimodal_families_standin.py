"""Kimi-VL, whose processor cannot be built here (remote code in the model repository), against LLaMA-Factory 0.9.5 on
the same processor stand-in (tests/llm/golden/llamafactory_families_standin.safetensors, made by
make_llamafactory_families_standin.py): the expanded messages, the encoded rows and every collator tensor for each row
alone and for pairs (the stand-in white image in an image-less batch included); and the one-line errors a run without
the real processor stops with (Kimi-VL, and Llama 4 / LFM2-VL without torchvision; their real processors:
test_multimodal_torchvision_families.py)."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

from tests.goldens import assert_close_to_golden, load_generator, safetensors_golden  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"


GEN = load_generator(GOLDEN_DIR / "make_llamafactory_families_standin.py", "make_standin")


@pytest.fixture(scope="module")
def golden():
    return safetensors_golden(GOLDEN_DIR / "llamafactory_families_standin.safetensors")


def _plugin(family, processor=None):
    from lathe.llm.multimodal.common import MediaSettings
    from lathe.llm.multimodal.plugins import plugin_class

    tokenizer = GEN.make_tokenizer(family) if family in GEN.TOKENS else None  # the errors below need none
    processor = GEN.make_processor(family, tokenizer) if processor is None else processor
    return plugin_class(family)(processor, tokenizer, MediaSettings(**GEN.settings_of(family))), tokenizer


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
    plugin, tokenizer = _plugin(family)
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=GEN.FAMILIES[family][0]))
    assert template.multimodal == family
    media_ids = set(tokenizer.convert_tokens_to_ids(list(plugin.family.media_tokens(plugin.processor))))
    features = []
    for index, row in enumerate(GEN.ROWS):
        images = [GEN.make_image(name) for name in row["images"]]
        media = {"image": plugin.regularize("image", images, "row")} if images else {}
        messages = plugin.process_messages(GEN.messages_of(row), media)
        assert messages == json.loads(metadata[f"{family}.messages.{index}"]), index
        messages = [{**message, EXPANDED: True} for message in messages]
        ids, labels = encode_supervised_example(
            messages[:-1], messages[-1:], "", "", template, tokenizer, GEN.CUTOFF_LEN
        )
        assert ids == tensors[f"{family}.example.{index}.input_ids"].tolist(), index
        assert labels == tensors[f"{family}.example.{index}.labels"].tolist(), index
        assert plugin.cut_reason(ids, media) is None
        if media:
            last = max(position for position, token in enumerate(ids) if token in media_ids)
            assert plugin.cut_reason(ids[:last], media).startswith("cutoff_len cuts through the media")
        features.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)})
        features[-1].update({"images": images} if images else {})
    collator = MultimodalCollator(SFTDataCollator(tokenizer, pad_to_multiple_of=8), plugin, None)
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
    for prefix, chosen in batches.items():
        batch = collator([dict(feature) for feature in chosen])
        head = f"{family}.{prefix}."
        expected = {key[len(head) :]: value for key, value in tensors.items() if key.startswith(head)}
        for name, rows in json.loads(metadata[f"{family}.derived"]).items():
            if name.startswith(head):  # left out of the file: the pair's rows' single tensors joined
                key = name[len(head) :]
                expected[key] = torch.cat([tensors[f"{family}.single.{row}.{key}"] for row in rows])
        assert sorted(batch) == sorted(expected), prefix
        for key, value in expected.items():
            assert batch[key].shape == value.shape and batch[key].dtype == value.dtype, (prefix, key)
            assert_close_to_golden(batch[key], value, f"{family} {key}, {prefix}", abs=1e-5)


def test_a_run_without_the_real_processor_names_what_is_missing(tmp_path):
    """Kimi-VL: the folder's own processor needs trust_remote_code; Llama 4 and LFM2-VL: their processors need
    torchvision;
    YouTu-VL (and the other families lathe lacks): one line naming the family, never trained as text."""
    from types import SimpleNamespace

    from PIL import Image

    from lathe.llm.multimodal.plugins import get_plugin, plugin_module

    image = {"image": [Image.new("RGB", (28, 28))]}
    messages = [{"role": "user", "content": "<image>hi"}]
    kimi, _ = _plugin("kimi_vl", SimpleNamespace(image_processor=object()))
    with pytest.raises(ValueError, match="kimi_vl family needs the model's own processor .* trust_remote_code: true"):
        kimi.process_messages(messages, image)
    lfm2, _ = _plugin("lfm2_vl", SimpleNamespace())
    with pytest.raises(ValueError, match="lfm2_vl family needs the model's Lfm2VlProcessor.*pip install torchvision"):
        lfm2.process_messages(messages, image)
    llama4, _ = _plugin("llama4", SimpleNamespace(image_processor=object()))
    with pytest.raises(ValueError, match="lacks patch_size, downsample_ratio.*pip install torchvision"):
        llama4.process_messages(messages, image)
    if importlib.util.find_spec("torchvision") is None:
        with pytest.raises(ValueError, match="the llama4 family needs torchvision"):
            get_plugin(SimpleNamespace(name="llama4", multimodal="llama4"), object(), object())
    # every plugin of LLaMA-Factory 0.9.5's table is a family now: a name from a later release is one line
    with pytest.raises(ValueError, match=r"template 'next_vl' \(multimodal family 'next_vl'\): image, video"):
        plugin_module("next_vl", "next_vl")


def test_families_without_a_composite_are_vision_language_models():
    """LLaMA-Factory registers no composite model for LFM2-VL and ERNIE-4.5-VL (they train whole), yet their batches
    need the media tensors and their runs the processor: lathe used to collate LFM2-VL rows as text (no
    pixel_values) and save no processor."""
    from types import SimpleNamespace

    from lathe.llm.multimodal.saving import processor_callbacks
    from lathe.llm.multimodal.towers import composite_of, is_vision_language
    from lathe.llm.workflows.sft import multimodal_collator

    def model(model_type):
        return SimpleNamespace(config=SimpleNamespace(model_type=model_type))

    media = SimpleNamespace(plugin=SimpleNamespace(tokenizer=None), processor=object())
    for model_type in ("lfm2_vl", "ernie4_5_vl_moe"):
        assert composite_of(model(model_type)) is None and is_vision_language(model(model_type))
        assert type(multimodal_collator(object(), model(model_type), media)).__name__ == "MultimodalCollator"
        assert len(processor_callbacks(media, model(model_type))) == 1
    text = object()
    assert not is_vision_language(model("llama")) and multimodal_collator(text, model("llama"), media) is text


def test_lfm2_vl_refuses_an_image_split_into_tiles():
    """Lfm2VlImageProcessor gives one spatial shape per tile of an image over its token budget; LLaMA-Factory 0.9.5
    counts the k-th shape for the k-th image (the model then fails on the extra features): one line with the fix."""
    from types import SimpleNamespace

    from PIL import Image

    def split(images, return_tensors="pt"):  # the first image in 3 tiles and a thumbnail, as the processor splits
        return {"spatial_shapes": torch.tensor([[4, 4]] * (len(images) + 3))}

    plugin, _ = _plugin("lfm2_vl", SimpleNamespace(image_processor=split))
    images = {"image": [Image.new("RGB", (28, 28)), Image.new("RGB", (28, 28))]}
    with pytest.raises(ValueError, match=r"split an image into tiles \(5 tiles for 2 images\).*image_max_pixels"):
        plugin.process_messages([{"role": "user", "content": "<image><image>hi"}], images)
