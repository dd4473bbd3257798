"""Youtu-VL (youtu_vl template) against LLaMA-Factory 0.9.5 (tests/llm/golden/llamafactory_youtu_vl.safetensors, made
by make_llamafactory_youtu_vl.py): one `<|vision_start|><|image_pad|><|vision_end|>` per image, the encoded rows, and
every collated tensor (the image processor's, passed through; the stand-in image in the image-less row) for each row
alone and for pairs. Youtu-VL's processor is remote code: both sides use a real transformers image processor in its
place (the golden's docstring), so the token and collator path is what is compared."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")
pytest.importorskip("transformers")

HERE = Path(__file__).parent


def _generator():
    spec = importlib.util.spec_from_file_location("make_youtu_vl", HERE / "golden" / "make_llamafactory_youtu_vl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


YOUTU = _generator()
BASE = YOUTU.BASE  # the families generator's rows, images and cutoff


def test_youtu_vl_encodes_and_collates_as_llamafactory():
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

    with safe_open(str(YOUTU.GOLDEN), "pt") as handle:
        tensors, metadata = {key: handle.get_tensor(key) for key in handle.keys()}, handle.metadata()
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    tokenizer, processor = YOUTU.make_tokenizer(), YOUTU.make_processor()
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="youtu_vl"))
    settings = {"image_max_pixels": BASE.IMAGE_MAX_PIXELS, "image_min_pixels": BASE.IMAGE_MIN_PIXELS}
    plugin = get_plugin(template, processor, tokenizer, MediaSettings(**settings))
    features = []
    for index, row in enumerate(BASE.ROWS):
        images = [BASE.make_image(name) for name in row["images"]]
        media = {"image": images} if images else {}
        messages = plugin.process_messages(BASE.messages_of(row), media)
        assert messages == json.loads(metadata[f"youtu_vl.messages.{index}"]), index
        messages = [{**message, EXPANDED: True} for message in messages]
        ids, labels = encode_supervised_example(messages[:-1], messages[-1:], "", "", template, tokenizer, 1024)
        assert ids == tensors[f"youtu_vl.example.{index}.input_ids"].tolist(), index
        assert labels == tensors[f"youtu_vl.example.{index}.labels"].tolist(), index
        if images:  # the last vision run cut: named
            assert plugin.cut_reason(ids, media) is None
            end = max(
                position
                for position, token in enumerate(ids)
                if token == tokenizer.convert_tokens_to_ids("<|vision_end|>")
            )
            assert plugin.cut_reason(ids[:end], media).startswith("cutoff_len cuts through the media")
        features.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids), "images": images})
    collator = MultimodalCollator(SFTDataCollator(tokenizer, pad_to_multiple_of=8), plugin, None)
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(2)})
    for name, chosen in batches.items():
        batch, expected = (
            collator([dict(feature) for feature in chosen]),
            golden_batch(tensors, metadata, "youtu_vl", name),
        )
        assert sorted(batch) == sorted(expected), name
        for key, value in expected.items():
            assert_close_to_golden(batch[key], value, f"youtu_vl {key}, {name}", abs=1e-5)


def test_youtu_vl_video_is_one_pad_and_needs_the_models_processor():
    """A video is one `<|video_pad|>` between the vision tokens (LLaMA-Factory's plugin; no golden: Youtu-VL's video
    processor is remote code); a processor without an image processor names trust_remote_code."""
    from lathe.llm.multimodal import youtu_vl
    from lathe.llm.multimodal.common import MediaSettings

    messages = [{"role": "user", "content": "<video> then <image>"}]
    expanded = youtu_vl.process_messages(messages, [], [], YOUTU.make_processor(), MediaSettings())
    assert expanded[0]["content"] == (
        "<|vision_start|><|video_pad|><|vision_end|> then <|vision_start|><|image_pad|><|vision_end|>"
    )
    with pytest.raises(ValueError, match="youtu_vl family needs the model's own processor.*trust_remote_code: true"):
        youtu_vl.process_messages(messages, [], [], object(), MediaSettings())
