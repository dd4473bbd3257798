"""The families with 3-D rotary positions beside Qwen2-VL (GLM-4.1V; Qwen2.5-Omni / Qwen3-Omni with images and
audio), token for token and tensor for tensor against LLaMA-Factory 0.9.5
(tests/llm/golden/llamafactory_mrope_families.safetensors, made by make_llamafactory_mrope_families.py): the
expanded messages, the encoded rows, and every tensor the collator returns for each row alone and for pairs
(pixel_values, image_grid_thw, input_features, feature_attention_mask, the position_ids and rope_deltas of the
family's tiny model's get_rope_index), stand-in image and audio included; the tiny model takes lathe's batches
with the loss it has on LLaMA-Factory's. The Qwen2.5-Omni video rows again, and Qwen3-Omni's, with transformers'
real Omni processors (torchvision test recipe; llamafactory_omni_video.safetensors), and three `lathe train` steps
per family against LLaMA-Factory's run_exp (llamafactory_mrope_families_train.json; Qwen3-Omni's audio attention:
ONE_AUDIO_WINDOW)."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")

from tests.goldens import assert_close_to_golden, load_generator, safetensors_golden  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"
FEATURES_ABS = 1e-3  # log-mel features: another CPU's FFT (see test_multimodal_families.py)


GEN = load_generator(GOLDEN_DIR / "make_llamafactory_mrope_families.py", "make_mrope")


@pytest.fixture(scope="module")
def golden():
    return safetensors_golden(GOLDEN_DIR / "llamafactory_mrope_families.safetensors")


@pytest.fixture(scope="module")
def video_folder(golden, tmp_path_factory):
    """The golden's MPEG-4 videos (tests/llm/media_files.py), byte for byte the files LLaMA-Factory read."""
    import hashlib

    from tests.llm.media_files import write_video_files

    folder = tmp_path_factory.mktemp("videos")
    for name, path in write_video_files(folder).items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == golden[1][f"sha256.{name}"], name
    return folder


def _setup(family, make_processor=None):
    from lathe.llm.config.train import DataArguments
    from lathe.llm.multimodal.common import MediaSettings
    from lathe.llm.multimodal.plugins import plugin_class
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tokenizer = GEN.make_tokenizer(family)
    processor = (make_processor or GEN.make_processor)(family, tokenizer)
    template = get_template_and_fix_tokenizer(tokenizer, DataArguments(template=GEN.spec_of(family)[0]))
    plugin = plugin_class(template.multimodal)(processor, tokenizer, MediaSettings(**GEN.settings_of(family)))
    return tokenizer, processor, template, plugin


@pytest.mark.parametrize("family", list(GEN.FAMILIES))
def test_family_encodes_and_collates_as_llamafactory(family, golden, video_folder):
    check_family(family, golden, video_folder)


def check_family(family, golden, video_folder, make_processor=None) -> int:
    """The family's rows against the golden (messages, ids, labels, the cutoff check), then every batch of a row
    alone and of a pair, tensor for tensor, and the tiny model's loss; returns the number of batches checked."""
    from lathe.llm.data.collator import SFTDataCollator
    from lathe.llm.data.supervised import encode_supervised_example
    from lathe.llm.multimodal.collator import MultimodalCollator
    from lathe.llm.multimodal.encode import EXPANDED

    tensors, metadata = golden
    assert json.loads(metadata["versions"])["llamafactory"] == "0.9.5"
    tokenizer, processor, template, plugin = _setup(family, make_processor)
    media_ids = set(tokenizer.convert_tokens_to_ids(GEN.tokens_of(family)))
    features = []
    for index, row in enumerate(GEN.rows_of(family)):
        given = GEN.media_of(family, row, video_folder)
        given = {key: items for key, items in given.items() if items}  # the rows' media: the collator opens them
        media = {kind[:-1]: plugin.regularize(kind[:-1], items, f"row {index}") for kind, items in given.items()}
        messages = plugin.process_messages(GEN.messages_of(row), media)
        assert messages == json.loads(metadata[f"{family}.messages.{index}"]), index
        messages = [{**message, EXPANDED: True} for message in messages]
        ids, labels = encode_supervised_example(
            messages[:-1], messages[-1:], "", "", template, tokenizer, GEN.CUTOFF_LEN
        )
        assert ids == tensors[f"{family}.example.{index}.input_ids"].tolist(), index
        assert labels == tensors[f"{family}.example.{index}.labels"].tolist(), index
        assert plugin.cut_reason(ids, media) is None
        if media:  # a cutoff through the last media token is named
            last = max(position for position, token in enumerate(ids) if token in media_ids)
            assert plugin.cut_reason(ids[:last], media).startswith("cutoff_len cuts through the media")
        features.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)})
        features[-1].update(given)

    model = GEN.make_model(family, tokenizer)
    collator = MultimodalCollator(SFTDataCollator(tokenizer, pad_to_multiple_of=8), plugin, model)
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
            tolerance = FEATURES_ABS if key == "input_features" else 1e-5
            assert_close_to_golden(batch[key], value, f"{family} {key}, {prefix}", abs=tolerance)
        if model is not None and prefix in ("single.0", "pair.0"):
            with torch.no_grad():
                loss, reference = model(**batch).loss, model(**expected).loss
            assert torch.isfinite(loss) and loss.item() == pytest.approx(reference.item(), abs=1e-6), prefix
    return len(batches)


OMNI_VIDEO = load_generator(GOLDEN_DIR / "make_llamafactory_omni_video.py", "make_omni_video")
OMNI_VIDEO_TRAIN = load_generator(GOLDEN_DIR / "make_llamafactory_omni_video_train.py", "make_omni_video_train")


def check_omni_video_with_the_real_processor(folder: str) -> None:
    """Run under the torchvision test recipe: the Qwen2.5-Omni and Qwen3-Omni video families with transformers' own
    Qwen2_5OmniProcessor / Qwen3OmniMoeProcessor (Qwen2VLImageProcessor, Qwen2VLVideoProcessor) against
    LLaMA-Factory's encoding with it (llamafactory_omni_video.safetensors); prints {family: batches checked} as JSON."""
    import hashlib

    golden = safetensors_golden(GOLDEN_DIR / "llamafactory_omni_video.safetensors")
    for path in Path(folder).iterdir():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == golden[1][f"sha256.{path.name}"], path.name
    make_processor = lambda family, tokenizer: OMNI_VIDEO.make_processor(GEN, tokenizer, family)  # noqa: E731
    for family, name in (("qwen2_omni_video", "Qwen2_5OmniProcessor"), ("qwen3_omni_video", "Qwen3OmniMoeProcessor")):
        _, processor, _, _ = _setup(family, make_processor)
        parts = [type(part).__name__ for part in (processor, processor.image_processor, processor.video_processor)]
        assert parts == [name, "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor"], parts
    checked = {family: check_family(family, golden, Path(folder), make_processor) for family in OMNI_VIDEO.FAMILIES}
    check_long_audio_in_video(golden, Path(folder))
    print(json.dumps(checked))


def check_long_audio_in_video(golden, folder: Path) -> None:
    """A Qwen3-Omni use_audio_in_video row whose 3-second audio spans more than one chunk of audio tokens: the same
    run as LLaMA-Factory's (chunks of 2 * 25 temporal positions: no processor of its transformers, <= 5.6, has a
    position_id_per_seconds; 5.23's Qwen3OmniMoeProcessor has 13.0, which would cut the audio at 26 tokens)."""
    family = OMNI_VIDEO.LONG_AUDIO_FAMILY
    _, processor, _, plugin = _setup(family, lambda family, tokenizer: OMNI_VIDEO.long_audio_processor(GEN, tokenizer))
    assert plugin.processor is processor and type(processor).__name__ == "Qwen3OmniMoeProcessor"
    row = OMNI_VIDEO.LONG_AUDIO_ROW
    media = {"video": plugin.regularize("video", [str(folder / name) for name in row["videos"]], "long audio")}
    media["audio"] = plugin.regularize("audio", [OMNI_VIDEO.long_audio(GEN)], "long audio")
    messages = plugin.process_messages(GEN.messages_of(row), media)
    assert messages == json.loads(golden[1]["long_audio.messages"])


def train_omni_video_with_the_real_processor(root: str) -> None:
    """Run under the torchvision test recipe: `lathe train` of make_llamafactory_omni_video_train.py's cases (the
    thinker on two video rows, with use_audio_in_video and without, the folder holding the real Omni processor);
    prints {case: {loss, grad_norm, trainable, total}} as JSON."""
    from lathe.llm.config.train import DataArguments, parse_train_config
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.workflows.stages import run_train

    fix = lambda tokenizer, template: get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))  # noqa: E731

    from tests.llm.train_counts import ParameterCount

    results = {}
    for name, (family, keys) in OMNI_VIDEO_TRAIN.CASES.items():
        folder, data = OMNI_VIDEO_TRAIN.write_folders(Path(root) / name, family, fix)
        count, output = ParameterCount(), Path(root) / name / "out"
        config = OMNI_VIDEO_TRAIN.train_config(family, folder, data, output, **keys)
        run_train(parse_train_config(config), callbacks=[count])
        history = json.loads((output / "trainer_state.json").read_text())["log_history"]
        results[name] = {
            "loss": [entry["loss"] for entry in history if "loss" in entry],
            "grad_norm": [entry["grad_norm"] for entry in history if "loss" in entry],
            "trainable": count.counts[0],
            "total": count.counts[1],
        }
    print(json.dumps(results))


def test_omni_video_rows_with_the_real_processor_equal_llamafactory(video_folder, tmp_path):
    """The stand-in video processor above checks LLaMA-Factory's token and position path; here transformers' own
    Omni processor (torchvision, through the test recipe) gives LLaMA-Factory's pixel values too, with
    use_audio_in_video and without (make_llamafactory_omni_video.py), for Qwen2.5-Omni and for Qwen3-Omni (its
    Qwen3OmniMoeProcessor, template tokens and tiny MoE thinker); and in the same subprocess `lathe train` of the
    thinker on two video rows equals LLaMA-Factory's run_exp (make_llamafactory_omni_video_train.py): losses 1e-5,
    grad norms 1e-4 relative, trainable and total counts exactly."""
    from tests.llm.torchvision_recipe import run_with_torchvision

    code = (
        "from tests.llm.test_multimodal_mrope_families import check_omni_video_with_the_real_processor as check, "
        f"train_omni_video_with_the_real_processor as train; check({str(video_folder)!r}); train({str(tmp_path)!r})"
    )
    # the two JSON lines (training prints its plan and logs between them, those with single quotes)
    printed = [line for line in run_with_torchvision(code).stdout.splitlines() if line.startswith('{"')]
    assert json.loads(printed[0]) == {family: 6 for family in OMNI_VIDEO.FAMILIES}
    ours, expected_runs = json.loads(printed[-1]), json.loads(OMNI_VIDEO_TRAIN.GOLDEN.read_text())
    assert expected_runs["versions"]["llamafactory"] == "0.9.5" and sorted(ours) == sorted(OMNI_VIDEO_TRAIN.CASES)
    for name, run in ours.items():
        expected = expected_runs[name]
        assert (run["trainable"], run["total"]) == (expected["trainable"], expected["total"]), name
        assert_close_to_golden(run["loss"], expected["loss"], f"{name} losses", rel=0, abs=1e-5)
        assert_close_to_golden(run["grad_norm"], expected["grad_norm"], f"{name} norms", rel=1e-4)


def _train_generator():
    spec = importlib.util.spec_from_file_location(
        "make_mrope_train", GOLDEN_DIR / "make_llamafactory_mrope_families_train.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRAIN = _train_generator()


# LLaMA-Factory's runs are transformers 5.6's, lathe's 5.23's, and their Qwen3-Omni audio encoders differ: 5.6 passes
# the per-clip attention windows (cu_seqlens) to the attention function, which on sdpa / eager (every CPU run) ignores
# them, so each audio token attends to every audio token of the batch; 5.23 attends within each clip's window. With
# two clips in a batch (qwen3_omni_full / _lora) the first loss is 1e-3 apart. Those cases give 5.23 one window over
# the batch's audio tokens (ONE_AUDIO_WINDOW), 5.6's attention, to check the rest of the path; qwen3_omni_one_clip_full,
# one clip in its batch, needs nothing (docs/MULTIMODAL_FAMILIES.md, "Qwen3-Omni training").
ONE_AUDIO_WINDOW = ("qwen3_omni_full", "qwen3_omni_lora")


def attend_over_all_audio(monkeypatch) -> list:
    """transformers 5.6's Qwen3-Omni audio attention on 5.23: the windows helper gives one window spanning the
    batch's audio tokens. Returns the list of windows 5.23 would have used, one entry per audio encoder call."""
    import transformers
    from packaging.version import Version
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as omni

    windows = []
    if Version(transformers.__version__) <= Version("5.6.0"):
        return windows  # the same attention as LLaMA-Factory's run already
    windowed = omni.get_audio_cu_seqlens

    def one_window(*args, **kwargs):
        boundaries = windowed(*args, **kwargs)
        windows.append(boundaries.tolist())
        return torch.stack([boundaries[0], boundaries[-1]])

    monkeypatch.setattr(omni, "get_audio_cu_seqlens", one_window)  # raises if a later transformers renames it
    return windows


def test_qwen3_omni_gap_is_the_audio_attention_window(golden, monkeypatch):
    """The tiny Qwen3-Omni thinker (the training golden's weights) on LLaMA-Factory's collated batch of the training
    case's two rows: with 5.23's per-clip audio windows its loss is 1e-3 off LLaMA-Factory's first logged loss, with
    one window over both clips (5.6's attention) it is that loss."""
    from lathe.llm.config.train import DataArguments
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tensors, metadata = golden
    train_golden = json.loads((GOLDEN_DIR / "llamafactory_mrope_families_train.json").read_text())
    expected = train_golden["qwen3_omni_full"]["loss"][0]
    tokenizer = GEN.make_tokenizer("qwen3_omni")
    get_template_and_fix_tokenizer(tokenizer, DataArguments(template=GEN.FAMILIES["qwen3_omni"][0]))
    model = TRAIN.same_weights(GEN.make_model("qwen3_omni", tokenizer))
    head = "qwen3_omni.pair.0."  # rows 0 and 1, the training case's rows
    batch = {key[len(head) :]: value for key, value in tensors.items() if key.startswith(head)}
    for name, rows in json.loads(metadata["qwen3_omni.derived"]).items():
        if name.startswith(head):
            batch[name[len(head) :]] = torch.cat(
                [tensors[f"qwen3_omni.single.{row}.{name[len(head) :]}"] for row in rows]
            )
    with torch.no_grad():
        per_clip = model(**batch).loss.item()
        windows = attend_over_all_audio(monkeypatch)
        one_window = model(**batch).loss.item()
    if windows:  # transformers after 5.6: two clips of 3 and 7 audio tokens, a window each
        assert windows == [[0, 3, 10]]
        assert abs(per_clip - expected) > 5e-4, (per_clip, expected)
    assert_close_to_golden(one_window, expected, "the thinker's loss with one audio window", rel=0, abs=1e-5)


@pytest.mark.parametrize("name", list(TRAIN.CASES))
def test_lathe_train_three_steps_equal_llamafactory(name, tmp_path, monkeypatch):
    """`lathe train`, three steps of one batch of the family's two rows (image rows; the Omni thinkers' image-and-audio
    and audio rows, or TRAIN.ROWS) (full tuning with the towers and projectors frozen, LoRA on every linear layer):
    LLaMA-Factory's losses, grad norms and parameter counts (tests/llm/golden/llamafactory_mrope_families_train.json).
    The folder holds the image processor (and feature extractor) alone (no torchvision here, so no Glm4vProcessor):
    lathe loads them, as LLaMA-Factory's run was given them."""
    from lathe.llm.config.train import DataArguments, parse_train_config
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.workflows.stages import run_train

    golden = json.loads((GOLDEN_DIR / "llamafactory_mrope_families_train.json").read_text())
    family, keys = TRAIN.CASES[name]
    fix = lambda tokenizer, template: get_template_and_fix_tokenizer(tokenizer, DataArguments(template=template))  # noqa: E731
    model, data = TRAIN.write_folders(tmp_path, family, fix, TRAIN.ROWS.get(name, (0, 1)))
    if name in ONE_AUDIO_WINDOW:
        attend_over_all_audio(monkeypatch)

    from tests.llm.train_counts import ParameterCount

    count = ParameterCount()
    config = TRAIN.TRAIN.train_config(GEN, family, model, data, tmp_path / "out", **keys)
    run_train(parse_train_config(config), callbacks=[count])
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    expected = golden[name]
    assert count.counts == (expected["trainable"], expected["total"])
    if "lora" not in name:  # the saved model's config: no KV cache, in the text_config too
        assert TRAIN.saved_use_cache(tmp_path / "out") == expected["saved_use_cache"]
    assert_close_to_golden(
        [e["loss"] for e in history if "loss" in e], expected["loss"], f"{name} losses", rel=0, abs=1e-5
    )
    norms = [e["grad_norm"] for e in history if "loss" in e]
    assert_close_to_golden(norms, expected["grad_norm"], f"{name} norms", rel=1e-4)


def test_an_omni_folder_loads_as_llamafactory_loads_it_and_trains_its_thinker():
    """A Qwen2.5-Omni / Qwen3-Omni folder (thinker and talker) is built with AutoModelForTextToWaveform, and the
    thinker alone trains and is saved (LLaMA-Factory's loader); a thinker's own config is an image-text model."""
    from types import SimpleNamespace

    import transformers as tf

    from lathe.llm.model.loader import auto_model_class, thinker_of

    assert auto_model_class(tf.Qwen2_5OmniConfig()) is tf.AutoModelForTextToWaveform
    assert auto_model_class(tf.Qwen3OmniMoeConfig()) is tf.AutoModelForTextToWaveform
    omni = SimpleNamespace(config=SimpleNamespace(model_type="qwen2_5_omni"), thinker="the thinker")
    assert thinker_of(omni) == "the thinker"
    thinker = SimpleNamespace(config=SimpleNamespace(model_type="qwen2_5_omni_thinker"))
    assert thinker_of(thinker) is thinker
    assert auto_model_class(tf.Qwen2_5OmniThinkerConfig()) is tf.AutoModelForImageTextToText


def test_use_audio_in_video_rows_that_do_not_pair_a_video_with_its_audio_are_named(video_folder):
    """As LLaMA-Factory: a `<video>` with no `<audio>` after it, or unequal video and audio counts, is one line;
    use_audio_in_video on a family without it too; a GLM-4.1V video row names what is missing."""
    from lathe.llm.multimodal.common import MediaSettings
    from lathe.llm.multimodal.plugins import plugin_class

    _, _, _, plugin = _setup("qwen2_omni_video")
    video = plugin.regularize("video", [str(video_folder / "walk.mp4")], "row 0")
    audio = plugin.regularize("audio", [GEN.make_audio("short")], "row 0")
    with pytest.raises(ValueError, match="use_audio_in_video: each <video> must be followed by an <audio>"):
        plugin.process_messages([{"role": "user", "content": "<audio><video>"}], {"video": video, "audio": audio})
    with pytest.raises(ValueError, match=r"use_audio_in_video: 1 video\(s\) but 2 audio\(s\)"):
        plugin.process_messages(
            [{"role": "user", "content": "<video><audio><audio>"}], {"video": video, "audio": audio * 2}
        )
    glm = plugin_class("glm4v")(None, None, MediaSettings(use_audio_in_video=True))
    with pytest.raises(ValueError, match="use_audio_in_video: the glm4v family has no such option"):
        glm.check_settings()
    with pytest.raises(ValueError, match="lathe's glm4v family takes no video input: GLM-4.1V's per-frame video"):
        glm.check_kinds({"video": 1}, "row 3")
