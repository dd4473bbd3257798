"""The families beside Qwen2-VL, token for token and tensor for tensor against LLaMA-Factory 0.9.5
(tests/llm/golden/llamafactory_families.safetensors, made by make_llamafactory_families.py with the families'
real transformers processors, PIL image backends): `<image>` / `<audio>` expansion, the encoded rows
(PaliGemma's image prefix before BOS included), and every tensor the collator returns for each row alone and
for pairs: pixel_values, image_sizes, token_type_ids, cross_attention_mask, aspect ratios, input_features,
feature_attention_mask, with LLaMA-Factory's stand-in image or audio in batches that have none."""

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

GOLDEN_DIR = Path(__file__).parent / "golden"


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


def _settings():
    from lathe.llm.multimodal.common import MediaSettings

    return MediaSettings(
        image_max_pixels=GEN.IMAGE_MAX_PIXELS,
        image_min_pixels=GEN.IMAGE_MIN_PIXELS,
        audio_sampling_rate=GEN.SAMPLING_RATE,
    )


def _media(family, row):
    media = GEN.media_of(family, row)
    return media.get("images", []), media.get("audios", [])


@pytest.mark.parametrize("family", list(GEN.FAMILIES))
def test_family_encodes_and_collates_as_llamafactory(family, golden):
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.common import FamilyCollator
    from lathe.llm.multimodal.plugins import plugin_module
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tensors, metadata = golden
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    assert metadata[f"{family}.processor"].endswith(("Pil", "FeatureExtractor"))  # the goldens' PIL backend
    module = plugin_module(family)
    tokenizer = GEN.make_tokenizer(family)
    processor = GEN.make_processor(family, tokenizer)
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=GEN.FAMILIES[family][0]))
    # the expanded messages hold the family's media tokens, and LLaVA's is `<image>` itself: encode them with the
    # text template (on main a multimodal template refuses any placeholder left in a message)
    template = dataclasses.replace(template, multimodal="")
    settings = _settings()
    rows = GEN.rows_of(family)
    features = []
    for index, row in enumerate(rows):
        images, audios = _media(family, row)
        messages = module.process_messages(GEN.messages_of(row), images, audios, processor, settings)
        assert messages == json.loads(metadata[f"{family}.messages.{index}"]), index
        prefix = module.prefix_ids(images, tokenizer, processor)
        ids, labels = encode_supervised_example(
            messages[:-1], messages[-1:], "", "", template, tokenizer, GEN.CUTOFF_LEN - len(prefix)
        )
        ids, labels = prefix + ids, [-100] * len(prefix) + labels
        assert ids == tensors[f"{family}.example.{index}.input_ids"].tolist(), index
        assert labels == tensors[f"{family}.example.{index}.labels"].tolist(), index
        features.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)})
        features[-1].update({"images": images} if images else {"audios": audios} if audios else {})

    collator = FamilyCollator(SFTDataCollator(tokenizer, pad_to_multiple_of=8), processor, module, settings)
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
    for prefix, chosen in batches.items():
        batch = collator(chosen)
        head = f"{family}.{prefix}."
        expected = {key[len(head) :]: value for key, value in tensors.items() if key.startswith(head)}
        for name in json.loads(metadata[f"{family}.derived"]):  # left out of the file: the rows' tensors joined
            if name.startswith(head):
                first = int(prefix.split(".")[1]) * 2
                key = name[len(head) :]
                expected[key] = torch.cat([tensors[f"{family}.single.{row}.{key}"] for row in (first, first + 1)])
        assert sorted(batch) == sorted(expected), prefix
        for key, value in expected.items():
            assert batch[key].shape == value.shape and batch[key].dtype == value.dtype, (prefix, key)
            if value.is_floating_point():
                assert torch.allclose(batch[key], value, atol=1e-5, rtol=0), (prefix, key)
            else:
                assert torch.equal(batch[key], value), (prefix, key)
