"""MiniCPM-V (minicpm_v) and MiniCPM-o (minicpm_o), whose processor and tokenizer are remote code in the openbmb
repositories, against LLaMA-Factory 0.9.5 on the same stand-in remote code (tests/llm/golden/minicpm_remote_code.py,
loaded from a tiny model folder with trust_remote_code; golden llamafactory_minicpm.safetensors, made by
make_llamafactory_minicpm.py): the expanded messages, the encoded rows and the collator's whole output (the model's
`data` dict: pixel_values, image_sizes, tgt_sizes, image_bound, audio features, lengths and bounds, positions) for
each row alone and for pairs, the stand-in image and silence included (and `lathe data preview --dump`'s file of
them); three `lathe train` steps of the stand-in model against LLaMA-Factory's run_exp
(llamafactory_minicpm_train.json); the composite parts; and the one-line errors of a run without the model's own
code."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

from tests.goldens import assert_close_to_golden, load_generator, safetensors_golden  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"
GEN = load_generator(GOLDEN_DIR / "make_llamafactory_minicpm.py", "make_minicpm")


@pytest.fixture(scope="module")
def golden():
    return safetensors_golden(GOLDEN_DIR / "llamafactory_minicpm.safetensors")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return GEN.write_folder(tmp_path_factory.mktemp("minicpm"))


def _arguments(folder, trust: bool):
    from lathe.llm.config.train import ModelArguments

    settings = GEN.settings_of("minicpm_v")
    return ModelArguments(model_name_or_path=folder, trust_remote_code=trust, **settings)


@pytest.mark.parametrize("family", list(GEN.FAMILIES))
def test_family_encodes_and_collates_as_llamafactory(family, golden, folder, tmp_path):
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.dump import dump_examples
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.model.loader import load_tokenizer
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import EXPANDED, MediaEncoder
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tensors, metadata = golden
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    model_args = _arguments(folder, trust=True)
    tokenizer = load_tokenizer(model_args)  # the folder's own tokenizer class (trust_remote_code)
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=GEN.FAMILIES[family]))
    assert template.multimodal == family
    plugin = MediaEncoder.for_run(template, tokenizer, model_args).plugin  # the folder's processor, as a run loads it
    end_ids = set(tokenizer.convert_tokens_to_ids(list(plugin.family.media_tokens(plugin.processor))))
    features = []
    for index, row in enumerate(GEN.rows_of(family)):
        raw = GEN.media_of(row)
        media = {kind[:-1]: plugin.regularize(kind[:-1], items, "row") for kind, items in raw.items()}
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
            last = max(position for position, token in enumerate(ids) if token in end_ids)
            assert plugin.cut_reason(ids[:last], media).startswith("cutoff_len cuts through the media")
        features.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids), **raw})
    collator = MultimodalCollator(SFTDataCollator(tokenizer, pad_to_multiple_of=8), plugin, None)
    batches = {f"single.{index}": [feature] for index, feature in enumerate(features)}
    batches.update({f"pair.{pair}": features[2 * pair : 2 * pair + 2] for pair in range(len(features) // 2)})
    for prefix, chosen in batches.items():
        mine = {}
        structure = GEN.flatten(collator([dict(feature) for feature in chosen]), f"{family}.{prefix}", mine)
        assert structure == json.loads(metadata[f"{family}.{prefix}.structure"]), prefix
        for key, value in mine.items():
            expected = tensors[key]
            assert value.shape == expected.shape and value.dtype == expected.dtype, key
            assert_close_to_golden(value, expected, key, abs=1e-5)
    # `lathe data preview --dump` writes the nested batch one tensor per path (the golden's names)
    dump_examples([dict(feature) for feature in features], collator, str(tmp_path / "dump.safetensors"))
    dumped = safetensors_golden(tmp_path / "dump.safetensors")[0]
    golden_keys = {key[len(family) + 1 :] for key in tensors if key.startswith(f"{family}.")}
    assert set(dumped) == golden_keys
    for key, value in dumped.items():
        assert_close_to_golden(value, tensors[f"{family}.{key}"], f"dumped {key}", abs=1e-5)


def test_a_run_without_the_model_code_is_one_line(folder, tmp_path):
    """The folder's tokenizer and processor without trust_remote_code, a processor that is not MiniCPM-V's, a
    config.json of MiniCPM-V without its model code (transformers has no minicpmv): one line naming the key or the
    files; minicpm_o takes images, videos and audio (LLaMA-Factory's one plugin)."""
    import shutil
    from types import SimpleNamespace

    from PIL import Image

    from lathe.llm.model.loader import load_config, load_tokenizer
    from lathe.llm.multimodal.encode import load_processor
    from lathe.llm.multimodal.plugins import plugin_class

    key = "the .* is the model folder's own code .*: set trust_remote_code: true to run it$"
    with pytest.raises(ValueError, match=key.replace(".*", "tokenizer", 1)):
        load_tokenizer(_arguments(folder, trust=False))
    with pytest.raises(ValueError, match=key.replace(".*", "processor", 1)):
        load_processor(folder, trust_remote_code=False)
    no_code = shutil.copytree(folder, tmp_path / "no_code")
    (no_code / "config.json").write_text(json.dumps({"model_type": "minicpmv", "architectures": ["MiniCPMV"]}))
    with pytest.raises(ValueError, match="model_type 'minicpmv' is not in transformers .* modeling_minicpmv.py"):
        load_config(_arguments(str(no_code), trust=True))
    plugin = plugin_class("minicpm_o")(SimpleNamespace(image_processor=object()), SimpleNamespace())
    messages = [{"role": "user", "content": "<image><audio>hi"}]
    media = {"image": [Image.new("RGB", (28, 28))], "audio": [torch.zeros(160).numpy()]}
    with pytest.raises(
        ValueError,
        match=r"minicpm_o family needs the model's own .*lack image_processor\.get_slice.*, audio_feature_extract, ",
    ):
        plugin.process_messages(messages, media)
    plugin_class("minicpm_o")(None, None).check_kinds({"video": 1, "image": 1, "audio": 1}, "a row")  # LF's kinds


VIDEO_GEN = load_generator(GOLDEN_DIR / "make_llamafactory_minicpm_video.py", "make_minicpm_video")


@pytest.mark.parametrize("family", VIDEO_GEN.FAMILIES)
def test_video_rows_encode_and_collate_as_llamafactory(family, folder, tmp_path):
    """MiniCPM-V video rows (llamafactory_minicpm_video.safetensors) on the minicpm_v and minicpm_o templates (one
    plugin in LLaMA-Factory; minicpm_o's batches also get the stand-in silence): each frame sliced as an image (2
    slices, no image ids), the rows' ids and the collator's `data` (one entry per video) for each one-video row alone
    and both together; the rows and batch LLaMA-Factory 0.9.5 fails on (two videos: IndexError; an image and a video:
    its ValueError; a video row beside an image row: its collator drops the image row's pixels) refused in one line."""
    import hashlib

    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.model.loader import load_tokenizer
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import EXPANDED, MediaEncoder
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from tests.llm.media_files import write_video_files

    tensors, metadata = safetensors_golden(VIDEO_GEN.GOLDEN)
    files = write_video_files(tmp_path)
    hashes = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in files.items()}
    assert hashes == json.loads(metadata["video_hashes"])
    model_args = _arguments(folder, trust=True)
    tokenizer = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=family))
    plugin = MediaEncoder.for_run(template, tokenizer, model_args).plugin
    features = []
    for index, row in enumerate(VIDEO_GEN.ROWS):
        media = {"video": plugin.regularize("video", [str(files[name]) for name in row["videos"]], "row")}
        if row.get("images"):
            media["image"] = [GEN.make_image(name) for name in row["images"]]
        messages = VIDEO_GEN.messages_of(row)
        if f"{family}.error.{index}" in metadata:  # LLaMA-Factory failed: lathe names its failure
            failure = metadata[f"{family}.error.{index}"]
            named = "IndexError: list index out of range" if len(row["videos"]) > 1 else failure.split(": ", 1)[1]
            assert named in failure
            with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
                plugin.process_messages(messages, media)
            continue
        messages = plugin.process_messages(messages, media)
        assert messages == json.loads(metadata[f"{family}.messages.{index}"]), index
        messages = [{**message, EXPANDED: True} for message in messages]
        ids, labels = encode_supervised_example(messages[:-1], messages[-1:], "", "", template, tokenizer, 1024)
        assert ids == tensors[f"{family}.example.{index}.input_ids"].tolist(), index
        assert labels == tensors[f"{family}.example.{index}.labels"].tolist(), index
        assert plugin.cut_reason(ids, media) is None
        features.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)})
        features[-1]["videos"] = [str(files[name]) for name in row["videos"]]
    collator = MultimodalCollator(SFTDataCollator(tokenizer, pad_to_multiple_of=8), plugin, None)
    for prefix, rows in VIDEO_GEN.BATCHES.items():
        mine = {}
        batch = collator([dict(features[row]) for row in rows])
        structure = GEN.flatten(batch, f"{family}.{prefix}", mine)
        assert structure == json.loads(metadata[f"{family}.{prefix}.structure"]), prefix
        for key, value in mine.items():
            if key not in tensors:  # the pair's frames: the single rows', minicpm_o's: minicpm_v's (kept once)
                key = "minicpm_v." + key.split(".", 1)[1]
            if key not in tensors:
                video, frame = key.rsplit(".", 2)[-2:]
                key = f"minicpm_v.single.{video}.data.pixel_values.0.{frame}"
            assert_close_to_golden(value, tensors[key], key, abs=1e-5)
    mixed = json.loads(metadata[f"{family}.mixed.structure"])["data"]
    assert len(mixed["pixel_values"]) == 1 and len(mixed["image_bound"]) == 2  # LLaMA-Factory's: the video's alone
    image_row = {"input_ids": [1, 2], "labels": [1, 2], "attention_mask": [1, 1], "images": [GEN.make_image("wide")]}
    with pytest.raises(ValueError, match="needs one video in every row: LLaMA-Factory 0.9.5's collator gives"):
        collator([dict(features[0]), image_row])


def test_freezing_uses_llamafactory_parts_of_minicpm():
    """freeze_vision_tower / freeze_multi_modal_projector freeze MiniCPM-V's vpm / resampler (and MiniCPM-o's audio
    parts), as LLaMA-Factory registers minicpmv and minicpmo; a MiniCPM model is found by its model_type."""
    from types import SimpleNamespace

    from lathe.llm.multimodal.towers import composite_of

    minicpm_o = composite_of(SimpleNamespace(config=SimpleNamespace(model_type="minicpmo")))
    assert minicpm_o.frozen_keys() == {"vpm", "apm", "audio_avg_pooler", "audio_projection_layer", "tts", "resampler"}
    assert minicpm_o.lora_conflict_keys == ("audio_projection_layer",)
    minicpm_v = composite_of(SimpleNamespace(config=SimpleNamespace(model_type="minicpmv")))
    assert minicpm_v.frozen_keys(vision=False, language=True) == {"resampler", "llm"}


def test_serving_refuses_images_with_the_reason(folder):
    """lathe chat / api: MiniCPM-V's model takes the `data` dict and generates with its own code."""
    from types import SimpleNamespace

    from lathe.llm.inference.vision import _plugin_encoder
    from lathe.llm.templates import TEMPLATES

    config = SimpleNamespace(model=_arguments(folder, trust=True), data=SimpleNamespace())
    tokenizer = SimpleNamespace()
    encoder = _plugin_encoder(config, TEMPLATES["minicpm_v"], tokenizer)
    assert "minicpm_v family's model takes its batch in its own form" in encoder.refusal


@pytest.mark.parametrize("trust", [False, True])
def test_lathe_train_without_the_model_code_stops_with_one_line(folder, tmp_path, trust):
    """`lathe train` on a MiniCPM-V folder whose config.json names no model code (transformers has no minicpmv):
    without trust_remote_code the folder's tokenizer stops it naming the key; with it, the model names the files."""
    import shutil

    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.stages import run_train

    model = shutil.copytree(folder, tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"model_type": "minicpmv", "architectures": ["MiniCPMV"]}))
    data = tmp_path / "data"
    data.mkdir()
    GEN.make_image("wide").save(data / "wide.png")
    rows = [{"messages": [{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "A fox."}]}]
    (data / "rows.json").write_text(json.dumps([{**rows[0], "images": ["wide.png"]}]))
    columns = {"messages": "messages", "images": "images"}
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
    (data / "dataset_info.json").write_text(
        json.dumps({"rows": {"file_name": "rows.json", "formatting": "sharegpt"} | {"columns": columns, "tags": tags}})
    )
    config = {
        "model_name_or_path": str(model),
        "trust_remote_code": trust,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "rows",
        "dataset_dir": str(data),
        "template": "minicpm_v",
        "output_dir": str(tmp_path / "out"),
        "max_steps": 1,
        "report_to": "none",
        "use_cpu": True,
    }
    why = "model_type 'minicpmv' is not in transformers" if trust else "own code .*: set trust_remote_code: true"
    with pytest.raises(ValueError, match=why):
        run_train(parse_train_config(config))


TRAIN_GOLDEN = json.loads((GOLDEN_DIR / "llamafactory_minicpm_train.json").read_text())


@pytest.mark.parametrize("case", list(GEN.TRAIN_CASES))
def test_lathe_train_three_steps_equal_llamafactory(case, tmp_path):
    """Three sft steps of the stand-in MiniCPM-V model (its own code, trust_remote_code; the towers and resampler
    frozen) on two rows: LLaMA-Factory's run_exp losses (1e-5), grad norms (1e-4 relative) and counts; MiniCPM-o's
    audio case through audio_bounds; minicpmo_video: two one-video rows (each frame sliced as an image). Typed
    minicpmv, transformers 5 loads the folder's tokenizer without its remote class and LLaMA-Factory 0.9.5 fails in
    its collator (recorded); lathe reads the tokens' ids and trains the minicpmo-typed run's numbers (apm trains
    there: minicpmv's registration freezes vpm alone)."""
    from lathe.llm.config.train import DataArguments, parse_train_config
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.workflows.stages import run_train

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    from tests.llm.train_counts import ParameterCount

    expected, unfrozen = TRAIN_GOLDEN[case], 0
    if case == "minicpmv_typed":
        assert expected == {"error": "AttributeError: TokenizersBackend has no attribute im_start_id"}
        expected, unfrozen = TRAIN_GOLDEN["minicpmo_typed"], 16 * 16 + 16  # apm: Linear(4 features x 4 frames, 16)
    model, data = GEN.write_train_folders(tmp_path, fix_tokenizer, case)
    keys = {"use_cpu": True, "dataloader_num_workers": 0, "preprocessing_num_workers": None}
    count = ParameterCount()
    run_train(parse_train_config(GEN.train_config(model, data, tmp_path / "out", case, **keys)), callbacks=[count])
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert count.counts == (expected["trainable"] + unfrozen, expected["total"])
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert_close_to_golden(losses, expected["loss"], f"{case} losses", rel=0, abs=1e-5)
    norms = [entry["grad_norm"] for entry in history if "loss" in entry]
    assert_close_to_golden(norms, expected["grad_norm"], f"{case} norms", rel=1e-4)
