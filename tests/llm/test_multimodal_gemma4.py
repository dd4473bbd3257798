"""Gemma 4 (templates gemma4: images and videos; gemma4n: also audio) token for token and tensor for tensor against
LLaMA-Factory 0.9.5 (tests/llm/golden/llamafactory_gemma4.safetensors, made by make_llamafactory_gemma4.py with
transformers' Gemma4Processor at a tiny size): the expanded messages, the encoded rows, every collated tensor of each
row alone and of pairs (the stand-in image and silence included), and the tiny model's loss on lathe's batch. Rows
without video run here; the video rows need transformers' video processor, i.e. torchvision, and run in a subprocess
with the torchvision test recipe (tests/llm/torchvision_recipe.py)."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

HERE = Path(__file__).parent
# Log-mel features: another CPU's FFT rounds differently (tests/llm/test_multimodal_families.py's FEATURES_ABS)
FEATURES_ABS = 1e-3


def _generator():
    spec = importlib.util.spec_from_file_location("make_gemma4", HERE / "golden" / "make_llamafactory_gemma4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
VIDEO_BATCHES = {  # the golden batches with a video row
    "gemma4": ["single.1", "single.3", "pair.0", "pair.1"],
    "gemma4n": ["single.3", "pair.1"],
}


def golden():
    from safetensors import safe_open

    with safe_open(str(HERE / "golden" / "llamafactory_gemma4.safetensors"), "pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}, handle.metadata()


def golden_batch(tensors: dict, metadata: dict, name: str, batch: str) -> dict:
    head = f"{name}.{batch}."
    expected = {key[len(head) :]: value for key, value in tensors.items() if key.startswith(head)}
    for full, rows in json.loads(metadata[f"{name}.derived"]).items():
        if full.startswith(head):  # left out of the file: the pair's rows' own tensors, joined
            key = full[len(head) :]
            expected[key] = torch.cat([tensors[f"{name}.single.{row}.{key}"] for row in rows])
    return expected


def compare(name: str, batches: list[str], videos: str) -> list[str]:
    """lathe's messages, rows and collated `batches` of template `name` against the golden; the batches checked."""
    from lathe.llm.config.train import DataArguments
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.common import MediaSettings
    from lathe.llm.multimodal.encode import EXPANDED
    from lathe.llm.multimodal.plugins import get_plugin
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from tests.goldens import assert_close_to_golden

    tensors, metadata = golden()
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    tokenizer = GEN.make_tokenizer()
    image_processor, extractor = GEN.make_parts()
    processor = GEN.make_processor(tokenizer) if batches_need_video(name, batches) else None
    # without torchvision lathe's loader gives the family the processor's parts (transformers builds
    # Gemma4Processor only with its video processor)
    parts = processor or type("Parts", (), {"image_processor": image_processor, "feature_extractor": extractor})()
    parts.audio_seq_length = 20
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=name))
    plugin = get_plugin(template, parts, tokenizer, MediaSettings(**GEN.SETTINGS))
    rows = GEN.ROWS[name]
    wanted = {int(batch.split(".")[1]) for batch in batches if batch.startswith("single")}
    wanted |= {
        row for batch in batches if batch.startswith("pair") for row in (2 * int(batch[5:]), 2 * int(batch[5:]) + 1)
    }
    features = {}
    for index in sorted(wanted):
        row = rows[index]
        loaded = GEN.media_of(row, Path(videos))
        paths = {"image": loaded["images"], "video": loaded["videos"], "audio": loaded["audios"]}
        media = {kind: plugin.regularize(kind, items, "a row") for kind, items in paths.items() if items}
        messages = plugin.process_messages(GEN.messages_of(row), media)
        assert messages == json.loads(metadata[f"{name}.messages.{index}"]), (name, index)
        messages = [{**message, EXPANDED: True} for message in messages]
        ids, labels = encode_supervised_example(
            messages[:-1], messages[-1:], "", "", template, tokenizer, GEN.CUTOFF_LEN
        )
        assert ids == tensors[f"{name}.example.{index}.input_ids"].tolist(), (name, index)
        assert labels == tensors[f"{name}.example.{index}.labels"].tolist(), (name, index)
        assert plugin.cut_reason(ids, media) is None
        if media:  # a cutoff through the last media run is named
            media_ids = set(tokenizer.convert_tokens_to_ids(list(plugin.family.media_tokens(plugin.processor))))
            last = max(position for position, token in enumerate(ids) if token in media_ids)
            assert plugin.cut_reason(ids[:last], media).startswith("cutoff_len cuts through the media")
        features[index] = {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)}
        features[index].update({f"{kind}s": items for kind, items in paths.items() if items})
    model = GEN.make_model(tokenizer)
    collator = MultimodalCollator(SFTDataCollator(tokenizer, pad_to_multiple_of=8), plugin, model)
    for batch_name in batches:
        first = int(batch_name.split(".")[1])
        chosen = (
            [features[first]] if batch_name.startswith("single") else [features[2 * first], features[2 * first + 1]]
        )
        model_inputs, expected = collator(chosen), golden_batch(tensors, metadata, name, batch_name)
        batch = dict(model_inputs)
        what = f"{name} {batch_name}"
        # transformers 5.23's video processor joins the videos' frames on one axis and counts them per video (what
        # its model takes); 5.6's (LLaMA-Factory's) stacked them per video
        if "pixel_values_videos" in expected:
            videos, frames = expected["pixel_values_videos"].shape[:2]
            assert batch.pop("num_frames_per_video").tolist() == [frames] * videos, what
            for key in ("pixel_values_videos", "video_position_ids"):
                expected[key] = expected[key].flatten(0, 1)
        # LLaMA-Factory pads mm_token_type_ids to its longest row only (shorter than input_ids under
        # pad_to_multiple_of); lathe to the batch's length, with 0
        types, golden_types = batch.pop("mm_token_type_ids"), expected.pop("mm_token_type_ids")
        assert types[:, : golden_types.shape[1]].tolist() == golden_types.tolist(), what
        assert not types[:, golden_types.shape[1] :].any(), what
        assert sorted(batch) == sorted(expected), what
        for key, value in expected.items():
            tolerance = FEATURES_ABS if key == "input_features" else 1e-5
            assert_close_to_golden(batch[key], value, f"{what} {key}", abs=tolerance)
        with torch.no_grad():
            loss = model(**model_inputs).loss
        assert_close_to_golden(loss.reshape(1), tensors[f"{name}.loss.{batch_name}"], f"{what} loss", abs=1e-5)
    return batches


def batches_need_video(name: str, batches: list[str]) -> bool:
    return any(batch in VIDEO_BATCHES[name] for batch in batches)


@pytest.fixture(scope="module")
def video_folder(tmp_path_factory):
    from tests.llm.media_files import write_video_files

    folder = tmp_path_factory.mktemp("gemma4_videos")
    written = write_video_files(folder)
    hashes = json.loads(golden()[1]["videos"])
    import hashlib

    for name, digest in hashes.items():  # the golden's videos, byte for byte
        assert hashlib.sha256(Path(written[name]).read_bytes()).hexdigest() == digest, name
    return str(folder)


@pytest.mark.parametrize("name", list(GEN.ROWS))
def test_gemma4_rows_without_video_equal_llamafactory(name, video_folder):
    pytest.importorskip("transformers")
    every = [f"single.{index}" for index in range(len(GEN.ROWS[name]))] + ["pair.0", "pair.1"]
    batches = [batch for batch in every if batch not in VIDEO_BATCHES[name]]
    assert compare(name, batches, video_folder) == batches


def test_gemma4_video_rows_equal_llamafactory(video_folder):
    """Every video batch of both templates, in one subprocess where torchvision imports (the test recipe)."""
    pytest.importorskip("transformers")
    from tests.llm.torchvision_recipe import run_with_torchvision

    code = (
        "import json; from tests.llm.test_multimodal_gemma4 import compare, VIDEO_BATCHES; "
        f"print(json.dumps([compare(name, batches, {video_folder!r}) for name, batches in VIDEO_BATCHES.items()]))"
    )
    checked = json.loads(run_with_torchvision(code).stdout.strip().splitlines()[-1])
    assert checked == list(VIDEO_BATCHES.values())


def _train_generator():
    spec = importlib.util.spec_from_file_location(
        "make_gemma4_train", HERE / "golden" / "make_llamafactory_gemma4_train.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRAIN = _train_generator()
TRAIN_GOLDEN = json.loads((HERE / "golden" / "llamafactory_gemma4_train.json").read_text())


def _lathe_train(name: str, root: Path) -> tuple[tuple[int, int], list[dict]]:
    """`lathe train` of case `name` on its folder (written here, transformers 5.23, no torchvision: lathe loads the
    processor's parts from the nested processor_config.json): (trainable, total) counts and the log history."""
    from lathe.llm.config.train import DataArguments, parse_train_config
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.workflows.stages import run_train

    def fix_tokenizer(tokenizer, template):
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))

    model, data = TRAIN.write_folders(root, TRAIN.CASES[name][0], fix_tokenizer)

    from tests.llm.train_counts import ParameterCount

    count = ParameterCount()
    run_train(parse_train_config(TRAIN.train_config(name, model, data, root / "out")), callbacks=[count])
    # the processor saved with the output as the folder had it (its parts nested in processor_config.json)
    saved = json.loads((root / "out" / "processor_config.json").read_text())
    assert saved == json.loads((model / "processor_config.json").read_text())
    return count.counts, json.loads((root / "out" / "trainer_state.json").read_text())["log_history"]


@pytest.mark.parametrize("name", [name for name in TRAIN.CASES if "error" not in TRAIN_GOLDEN[name]])
def test_lathe_trains_gemma4_as_llamafactory(name, tmp_path):
    """Three steps of one batch of two image rows: full (towers frozen), LoRA, the vision tower open."""
    from tests.goldens import assert_close_to_golden

    counts, history = _lathe_train(name, tmp_path)
    expected = TRAIN_GOLDEN[name]
    assert counts == (expected["trainable"], expected["total"])
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert_close_to_golden(losses, expected["loss"], f"{name} losses", rel=0, abs=1e-5)
    norms = [entry["grad_norm"] for entry in history if "loss" in entry]
    assert_close_to_golden(norms, expected["grad_norm"], f"{name} norms", rel=1e-4)


def test_gemma4n_counts_an_audio_files_tokens_from_its_waveform(tmp_path):
    """LLaMA-Factory 0.9.5 counts a row's audio tokens from the value in its audios column: for a file, the length of
    the path string (0 tokens here, and its model then stops: the golden's gemma4n_audio_full error). lathe counts
    the decoded waveform, with the processor parts it loads from the folder without torchvision (the feature
    extractor and audio_seq_length nested in processor_config.json); the gemma4 template takes no audio."""
    from lathe.llm.config.train import DataArguments
    from lathe.llm.multimodal.common import MediaSettings
    from lathe.llm.multimodal.encode import load_processor
    from lathe.llm.multimodal.gemma4 import audio_token_count
    from lathe.llm.multimodal.plugins import get_plugin
    from lathe.llm.templates import get_template_and_fix_tokenizer

    assert TRAIN_GOLDEN["gemma4n_audio_full"]["error"].startswith("ValueError: Audio features and audio tokens do not")
    TRAIN.write_processor(tmp_path)
    TRAIN.FAMILIES.write_wav(tmp_path / "long.wav", TRAIN.FAMILIES.make_audio("long"))
    tokenizer = GEN.make_tokenizer()
    tokenizer.save_pretrained(str(tmp_path))
    processor = load_processor(str(tmp_path))
    assert processor.audio_seq_length == 20 and type(processor.feature_extractor).__name__.startswith("Gemma4Audio")
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template="gemma4n"))
    plugin = get_plugin(template, processor, tokenizer, MediaSettings())
    audio = plugin.regularize("audio", [str(tmp_path / "long.wav")], "row 0")
    content = plugin.process_messages([{"role": "user", "content": "<audio>hi"}], {"audio": audio})[0]["content"]
    count = audio_token_count(8000, processor.feature_extractor, 20)  # 8000 samples: 50 mel frames, 13 tokens
    assert count == 13 and content == "<|audio>" + "<|audio|>" * count + "<audio|>hi"
    gemma4 = get_plugin(
        get_template_and_fix_tokenizer(tokenizer, DataArguments(template="gemma4")), processor, tokenizer
    )
    with pytest.raises(ValueError, match="lathe's gemma4 family takes no audio input: the gemma4 template takes none"):
        gemma4.check_kinds({"audio": 1}, "row 0")
