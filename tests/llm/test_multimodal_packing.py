"""Packing and neat_packing with Qwen2-VL image rows against LLaMA-Factory 0.9.5
(tests/llm/golden/llamafactory_mm_packing.safetensors, made by make_llamafactory_mm_packing.py): the packed rows
(ids, labels, segment masks, positions, each row's images), and the collated batch: pixel values, grids, mrope
positions computed per packed example, the block-diagonal mask and the tiny model's loss. Plus where LLaMA-Factory
fails and lathe does not (a cutoff_len the collator pads past; packed rows without images). Every other family
LLaMA-Factory packs, neat-packed (`family.*` in the same golden), and the ones that stop in one line."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

from tests.goldens import assert_close_to_golden  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def golden():
    from safetensors import safe_open

    with safe_open(str(GOLDEN_DIR / "llamafactory_mm_packing.safetensors"), "pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}, f.metadata()


@pytest.fixture(scope="module")
def assets():
    from lathe.llm.config.train import DataArguments
    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.encode import MediaEncoder
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from tests.llm.golden import make_llamafactory_mm_packing as packing_gen

    gen = packing_gen.base()
    tokenizer = gen.make_tokenizer()
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="qwen2_vl"))
    settings = MediaSettings(image_max_pixels=packing_gen.IMAGE_MAX_PIXELS, image_min_pixels=gen.IMAGE_MIN_PIXELS)
    media = MediaEncoder(template, tokenizer, "unused", settings, processor=gen.make_image_processor())
    model = gen.make_model(tokenizer)
    model.config._attn_implementation = "eager"
    return packing_gen, gen, tokenizer, template, media, model


def _pack(assets, indexes, cutoff_len, neat):
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.packing import preprocess_packed_supervised_dataset

    packing_gen, gen, tokenizer, template, media, _ = assets
    rows = [gen.ROWS[index] for index in indexes]
    examples = {
        "_prompt": [gen.messages_of(row)[:-1] for row in rows],
        "_response": [gen.messages_of(row)[-1:] for row in rows],
        "_system": [""] * len(rows),
        "_tools": [""] * len(rows),
        "_images": [[gen.make_image(name) for name in row["images"]] or None for row in rows],
    }
    data_args = DataArguments(template="qwen2_vl", cutoff_len=cutoff_len, packing=True, neat_packing=neat)
    return preprocess_packed_supervised_dataset(
        examples, template, tokenizer, data_args, media=media, media_kinds=("image",)
    )


def _collate(assets, packed):
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.multimodal.collator import MultimodalCollator

    *_, tokenizer, _, media, model = assets
    collator = MultimodalCollator(SFTDataCollator(tokenizer, model=model, pad_to_multiple_of=8), media.plugin, model)
    features = [{key: packed[key][index] for key in packed} for index in range(len(packed["input_ids"]))]
    return collator(features)


@pytest.fixture(scope="module")
def neat_rows(assets):
    packing_gen = assets[0]
    # LLaMA-Factory packs into cutoff_len - 1 (and pads to cutoff_len); lathe, given that capacity, packs alike
    return _pack(assets, packing_gen.IMAGE_ROWS, packing_gen.CUTOFF_LEN - 1, neat=True)


@pytest.mark.parametrize("case", ["neat", "plain"])
def test_packed_rows_and_their_images_equal_llamafactory(golden, assets, neat_rows, case):
    tensors, _ = golden
    packing_gen = assets[0]
    packed = neat_rows if case == "neat" else _pack(assets, packing_gen.IMAGE_ROWS, packing_gen.CUTOFF_LEN - 1, False)
    assert len(packed["input_ids"]) == len(tensors[f"{case}.rows.input_ids"])
    for index, ids in enumerate(packed["input_ids"]):
        size = len(ids)
        for key in ("input_ids", "labels", "attention_mask", "position_ids"):
            # every packed example starts with a prompt token: the first-label rule (packing.py) changes nothing here
            assert packed[key][index] == tensors[f"{case}.rows.{key}"][index, :size].tolist(), (case, key, index)
        assert set(tensors[f"{case}.rows.attention_mask"][index, size:].tolist()) == ({0} if case == "neat" else {1})
        assert len(packed["images"][index]) == int(tensors[f"{case}.rows.images"][index])


def test_collated_packed_batch_equals_llamafactory_neat_packing(golden, assets, neat_rows):
    tensors, _ = golden
    batch = _collate(assets, neat_rows)
    # LLaMA-Factory pads every packed row to cutoff_len, lathe to the longest row (a multiple of 8): the rest is
    # padding there (labels -100, masked out)
    length = batch["input_ids"].shape[-1]
    assert length < tensors["neat.input_ids"].shape[-1] and set(tensors["neat.labels"][:, length:].tolist()[0]) == {
        -100
    }
    for key in ("input_ids", "labels", "position_ids"):
        assert torch.equal(batch[key], tensors[f"neat.{key}"][..., :length]), key  # mrope per example, text row first
    assert torch.equal(batch["image_grid_thw"], tensors["neat.image_grid_thw"])
    assert_close_to_golden(batch["pixel_values"], tensors["neat.pixel_values"], "pixel_values", rel=1e-5, abs=1e-5)
    assert "rope_deltas" not in batch  # LLaMA-Factory's packed path sets none either
    # the block-diagonal mask: the same where LLaMA-Factory's rows hold tokens (it masks its padding rows whole)
    theirs = tensors["neat.attention_mask"] == 0
    mine = batch["attention_mask"] == 0 if batch["attention_mask"].dtype != torch.bool else batch["attention_mask"]
    real = tensors["neat.rows.attention_mask"] != 0
    for row in range(real.shape[0]):
        keep = real[row, :length].nonzero().flatten()
        assert torch.equal(mine[row, 0][keep][:, keep], theirs[row, 0][keep][:, keep])
    model = assets[-1]
    with torch.no_grad():
        loss = model(**batch).loss
    assert_close_to_golden(float(loss), float(tensors["loss.neat"]), "loss")


def test_plain_packing_keeps_examples_apart_unlike_llamafactory(golden, assets):
    """packing: true (not neat) gives lathe the neat batch (examples apart, mrope per example; packing.py); in
    LLaMA-Factory the examples attend to each other and the mrope positions run over the whole packed row."""
    tensors, _ = golden
    packing_gen = assets[0]
    batch = _collate(assets, _pack(assets, packing_gen.IMAGE_ROWS, packing_gen.CUTOFF_LEN - 1, False))
    length = batch["input_ids"].shape[-1]
    assert torch.equal(batch["position_ids"], tensors["neat.position_ids"][..., :length])
    assert not torch.equal(batch["position_ids"], tensors["plain.position_ids"][..., :length])
    with torch.no_grad():
        loss = assets[-1](**batch).loss
    assert_close_to_golden(float(loss), float(tensors["loss.neat"]), "loss")


def test_where_llamafactory_fails_lathe_trains(golden, assets):
    """LLaMA-Factory 0.9.5's neat packing fails on Qwen2-VL when the collator pads past cutoff_len (a cutoff_len that
    is not a multiple of 8) and on packed rows without images (the stand-in image); lathe collates both."""
    _, metadata = golden
    assert "position_ids shape mismatch" in metadata["error.unaligned"]
    assert "must match the size of tensor" in metadata["error.text"]
    packing_gen, gen, tokenizer, *_ = assets
    model = assets[-1]
    for indexes, cutoff_len in ((packing_gen.IMAGE_ROWS, packing_gen.CUTOFF_LEN), (packing_gen.TEXT_ROWS, 119)):
        batch = _collate(assets, _pack(assets, indexes, cutoff_len, neat=True))
        assert batch["input_ids"].shape[-1] % 8 == 0 and batch["position_ids"].shape[0] == 4
        with torch.no_grad():
            assert torch.isfinite(model(**batch).loss)
    # the stand-in image is an example of its own: no packed token attends to it
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    stand_in = (batch["input_ids"][0] == image_pad).nonzero().flatten()
    allowed = batch["attention_mask"][0, 0]
    allowed = allowed if allowed.dtype == torch.bool else allowed == 0
    assert len(stand_in) and not allowed[: int(stand_in[0]) - 1][:, stand_in].any()


@pytest.mark.slow
def test_lathe_train_with_neat_packing_equals_llamafactory(golden, tmp_path):
    """Three sft steps of `lathe train` with neat_packing on the mllm_demo rows: LLaMA-Factory's run_exp's losses
    and grad norms (lathe given cutoff_len 119 where LLaMA-Factory is given 120: it packs into cutoff_len - 1)."""
    import json

    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.stages import run_train
    from tests.llm import multimodal_cases as cases
    from tests.llm.golden.make_llamafactory_mm_packing import TRAIN_KEYS

    _, metadata = golden
    expected = json.loads(metadata["json.train"])
    model, data = cases.make_model_folder(tmp_path / "model"), cases.make_data_folder(tmp_path / "data")
    keys = {**TRAIN_KEYS, "cutoff_len": TRAIN_KEYS["cutoff_len"] - 1}
    run_train(parse_train_config(cases.train_config(model, data, tmp_path / "out", **keys)))
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    norms = [entry["grad_norm"] for entry in history if "loss" in entry]
    # the tolerances of the other multimodal training goldens (test_multimodal_train.py)
    assert_close_to_golden(losses, expected["loss"], "packed losses", rel=0, abs=1e-5)
    assert_close_to_golden(norms, expected["grad_norm"], "packed grad norms", rel=1e-4)


def _packed_against_alone(tokenizer, template_name, processor, settings, model, rows, media_of, kinds):
    """One neat-packed row of `rows` collated and scored, and each row alone: (packed loss, the token-weighted mean of
    the rows' own losses, how many examples matched their positions)."""
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.packing import preprocess_packed_supervised_dataset
    from lathe.llm.data.supervised import preprocess_supervised_dataset
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import MediaEncoder
    from lathe.llm.templates import get_template_and_fix_tokenizer

    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template_name))
    media = MediaEncoder(template, tokenizer, "unused", settings, processor=processor)
    model.config._attn_implementation = "eager"
    examples = {
        "_prompt": [[{"role": r, "content": c} for r, c in row["messages"][:-1]] for row in rows],
        "_response": [[{"role": r, "content": c} for r, c in row["messages"][-1:]] for row in rows],
        "_system": [""] * len(rows),
        "_tools": [""] * len(rows),
        **{f"_{column}": [media_of(row).get(column) or None for row in rows] for column in kinds},
    }
    data_args = DataArguments(template=template_name, cutoff_len=1024, packing=True, neat_packing=True)
    options = dict(media=media, media_kinds=tuple(column[:-1] for column in kinds))
    packed = preprocess_packed_supervised_dataset(examples, template, tokenizer, data_args, **options)
    alone = preprocess_supervised_dataset(examples, template, tokenizer, data_args, **options)
    collator = MultimodalCollator(SFTDataCollator(tokenizer, model=model), media.plugin, model)
    batch = collator([{key: packed[key][0] for key in packed}])
    (order,) = packed["position_ids"]  # the packed row's examples: where positions restart
    starts = [index for index, position in enumerate(order) if position == 0] + [len(order)]
    losses, counts, same_positions = [], [], 0
    with torch.no_grad():
        packed_loss = float(model(**batch).loss)
        for start, end in zip(starts[:-1], starts[1:]):
            index = alone["input_ids"].index(packed["input_ids"][0][start:end])
            single = collator([{key: alone[key][index] for key in alone}])
            if "position_ids" in single:
                assert torch.equal(batch["position_ids"][..., start:end], single["position_ids"])
                same_positions += 1
            losses.append(float(model(**single).loss))
            counts.append(sum(label != -100 for label in alone["labels"][index][1:]))
    assert len(losses) == len(rows)
    return packed_loss, sum(loss * count for loss, count in zip(losses, counts)) / sum(counts), same_positions


def test_qwen3_vl_packed_row_trains_as_its_examples_one_by_one():
    """Qwen3-VL (no LLaMA-Factory golden of its own): one packed row of three image rows gives each example the mrope
    positions and the loss it has alone (the loss over all trained tokens: the token-weighted mean of theirs)."""
    from lathe.llm.multimodal.base import MediaSettings
    from tests.llm import multimodal_cases as cases

    gen = cases.generator()
    tokenizer = gen.make_tokenizer()
    settings = MediaSettings(image_max_pixels=64 * 96, image_min_pixels=gen.IMAGE_MIN_PIXELS)
    rows = [{**row, "messages": row["messages"]} for row in gen.ROWS[:3]]
    packed_loss, expected, same_positions = _packed_against_alone(
        tokenizer,
        "qwen3_vl_nothink",
        cases.make_image_processor("qwen3_vl"),
        settings,
        cases.make_model(tokenizer, "qwen3_vl"),
        rows,
        lambda row: {"images": [gen.make_image(name) for name in row["images"]]},
        ("images",),
    )
    assert same_positions == 3 and packed_loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("family", ["llava", "llava_next"])
def test_family_packed_row_trains_as_its_examples_one_by_one(family):
    """LLaVA and LLaVA-NeXT pack too (their tensors do not depend on where a row's tokens sit): a packed row of the
    families golden's image rows gives the token-weighted mean of the rows' own losses. (Qwen2-Audio does not:
    transformers' Qwen2AudioForConditionalGeneration selects its loss tokens with a 2-D attention mask, and a packed
    batch's is 4-D.)"""
    import importlib.util

    from lathe.llm.multimodal.base import MediaSettings

    spec = importlib.util.spec_from_file_location("make_families", GOLDEN_DIR / "make_llamafactory_families.py")
    families = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(families)
    tokenizer = families.make_tokenizer(family)
    rows = [row for row in families.rows_of(family) if row.get("images") or row.get("audios")]
    kinds = ("audios",) if families.FAMILIES[family][1] == "audio" else ("images",)
    packed_loss, expected, _ = _packed_against_alone(
        tokenizer,
        families.FAMILIES[family][0],
        families.make_processor(family, tokenizer),
        MediaSettings(**families.settings_of(family)),
        families.make_model(family, tokenizer),
        rows,
        lambda row: families.media_of(family, row),
        kinds,
    )
    assert packed_loss == pytest.approx(expected, rel=1e-5)


def test_packing_media_rows_of_a_family_that_does_not_pack_stops_before_tokenizing(assets):
    from types import SimpleNamespace

    import datasets

    from lathe.llm.data.packing import preprocess_packed_supervised_dataset
    from lathe.llm.data.processors import media_options
    from lathe.llm.multimodal.gemma3 import Gemma3Plugin

    rows = datasets.Dataset.from_dict({"_prompt": [[]], "_images": [["cat.png"]]})
    plan = SimpleNamespace(
        stage="sft",
        packing=True,
        media=SimpleNamespace(plugin=Gemma3Plugin(None, assets[2])),
        train_attrs=[SimpleNamespace(name="mllm_demo")],
        eval_attrs=[],
    )
    with pytest.raises(
        ValueError, match="packing / neat_packing with image: lathe's gemma3 family does not pack: .*4-D"
    ):
        media_options(plan, preprocess_packed_supervised_dataset, rows)
    plan.media = SimpleNamespace(plugin=assets[4].plugin)  # qwen2_vl packs
    assert media_options(plan, preprocess_packed_supervised_dataset, rows)["media_kinds"] == ("image",)


FAMILY_GOLDEN_KEYS = ("input_ids", "labels", "attention_mask", "position_ids")


def _family_packed(family, monkeypatch):
    """lathe's neat-packed rows of `family`'s golden rows (FAMILY_CUTOFF_LEN - 1: LLaMA-Factory packs into one less),
    and its collator over them with the family's tiny model where one runs here."""
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.packing import preprocess_packed_supervised_dataset
    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import MediaEncoder
    from lathe.llm.multimodal.plugins import plugin_class
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from tests.llm.golden import make_llamafactory_mm_packing as packing_gen

    # the processors' stand-ins (no torchvision / timm here) are what the golden gave LLaMA-Factory
    monkeypatch.setattr(plugin_class(family), "requires", None, raising=False)
    module, template_name, rows, media_of = packing_gen.family_source(family)
    tokenizer = module.make_tokenizer(family)
    processor = module.make_processor(family, tokenizer)
    cutoff_len = packing_gen.FAMILY_CUTOFF_LEN - 1
    data_args = DataArguments(template=template_name, cutoff_len=cutoff_len, packing=True, neat_packing=True)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    media = MediaEncoder(
        template, tokenizer, "unused", MediaSettings(**module.settings_of(family)), processor=processor
    )
    examples = packing_gen.family_examples(module, rows, media_of)
    kinds = tuple(kind for kind in ("image", "audio") if any(examples[f"_{kind}s"]))
    packed = preprocess_packed_supervised_dataset(
        examples, template, tokenizer, data_args, media=media, media_kinds=kinds
    )
    model = module.make_model(family, tokenizer) if family in packing_gen.RUNNABLE else None
    if model is not None:
        model.config._attn_implementation = "eager"
    collator = MultimodalCollator(SFTDataCollator(tokenizer, model=model, pad_to_multiple_of=8), media.plugin, model)
    return packed, collator, model


def _families():
    from tests.llm.golden import make_llamafactory_mm_packing as packing_gen

    return list(packing_gen.FAMILY_SOURCES)


@pytest.mark.parametrize("family", _families())
def test_family_neat_packing_equals_llamafactory(golden, family, monkeypatch):
    """Every family LLaMA-Factory packs: the packed rows (ids, labels, segment ids, positions) and the collated batch
    (media tensors, token types, mllama's cross_attention_mask, GLM-4.1V's / ERNIE's mrope positions per example)
    equal LLaMA-Factory 0.9.5's neat packing; where LLaMA-Factory fails (Qwen2-Audio's and Gemma 3's forward on the
    4-D mask), lathe stops in one line naming the family; Omni packing, which LLaMA-Factory refuses, lathe trains."""
    tensors, metadata = golden
    name = f"family.{family}"
    packed, collator, model = _family_packed(family, monkeypatch)
    assert len(packed["input_ids"]) == len(tensors[f"{name}.rows.input_ids"])
    for index, ids in enumerate(packed["input_ids"]):
        for key in FAMILY_GOLDEN_KEYS:
            assert packed[key][index] == tensors[f"{name}.rows.{key}"][index, : len(ids)].tolist(), (key, index)
    features = [{key: packed[key][index] for key in packed} for index in range(len(packed["input_ids"]))]
    error = metadata.get(f"error.{name}", "")
    if (
        family == "qwen2_omni"
    ):  # LLaMA-Factory refuses; lathe packs (test_omni_packed_row_trains_as_its_examples_one_by_one)
        assert error == "RuntimeError: Omni models are not supported for packed sequences for now."
        batch = collator(features)
        assert batch["position_ids"].shape == (4, *batch["input_ids"].shape) and "rope_deltas" not in batch
        return
    if family in ("qwen2_audio", "gemma3"):
        assert error.startswith("IndexError: too many indices")
        with pytest.raises(ValueError, match=f"packed rows with media: lathe's {family} family does not pack: .*LLaMA"):
            collator(features)
        return
    batch = collator(features)
    length = batch["input_ids"].shape[-1]
    expected = {key[len(name) + 1 :]: value for key, value in tensors.items() if key.startswith(f"{name}.")}
    expected = {key: value for key, value in expected.items() if not key.startswith("rows.")}
    tensor_keys = [key for key, value in batch.items() if isinstance(value, torch.Tensor) and key != "attention_mask"]
    assert sorted(expected) == sorted(tensor_keys)  # (Gemma 3n's feature_attention_mask is None on both sides)
    for key, value in expected.items():
        mine = batch[key]
        if key in FAMILY_GOLDEN_KEYS or key in ("token_type_ids", "cross_attention_mask"):
            # LLaMA-Factory pads every packed row to cutoff_len, lathe to the longest (a multiple of 8): the rest is
            # padding (checked for the labels)
            axis = 1 if key == "cross_attention_mask" else -1
            value = value.narrow(axis, 0, length)
        if key in ("position_ids", "cross_attention_mask"):  # where the rows hold tokens (padding: masked out)
            real = tensors[f"{name}.rows.attention_mask"][:, :length] != 0
            mine, value = (mine[..., real], value[..., real]) if key == "position_ids" else (mine[real], value[real])
        if value.is_floating_point():
            assert_close_to_golden(mine, value, f"{family} {key}", rel=1e-5, abs=1e-5)
        else:
            assert torch.equal(mine, value), key
    assert set(tensors[f"{name}.labels"][:, length:].flatten().tolist()) <= {-100}
    if model is None:
        return
    with torch.no_grad():
        loss = model(**batch).loss
    assert torch.isfinite(tensors[f"loss.{name}"]) and torch.isfinite(loss)


def test_omni_packed_row_trains_as_its_examples_one_by_one():
    """Qwen2.5-Omni's thinker (LLaMA-Factory 0.9.5 refuses Omni packing): one packed row of image-and-audio rows gives
    each example the thinker's positions it has alone (its image grids and audio lengths) and the loss it has alone
    (the token-weighted mean). Rows with both kinds: a row alone without one gets that kind's stand-in."""
    from lathe.llm.multimodal.base import MediaSettings
    from tests.goldens import load_generator

    gen = load_generator(GOLDEN_DIR / "make_llamafactory_mrope_families.py", "make_mrope_families")
    first = gen.OMNI_ROWS[0]
    second = {"messages": [("user", "Hear <audio> and see <image> ."), ("assistant", "four")]}
    rows = [first, {**second, "images": ["small"], "audios": ["long"]}]
    tokenizer = gen.make_tokenizer("qwen2_omni")
    packed_loss, expected, same_positions = _packed_against_alone(
        tokenizer,
        gen.FAMILIES["qwen2_omni"][0],
        gen.make_processor("qwen2_omni", tokenizer),
        MediaSettings(**gen.settings_of("qwen2_omni")),
        gen.make_model("qwen2_omni", tokenizer),
        rows,
        lambda row: gen.media_of("qwen2_omni", row),
        ("images", "audios"),
    )
    assert same_positions == 2 and packed_loss == pytest.approx(expected, rel=1e-5)
