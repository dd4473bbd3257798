"""Video rows as LLaMA-Factory 0.9.5 encodes them, for Qwen2-VL, Qwen2.5-VL, Qwen3-VL (timestamps), LLaVA-NeXT-Video,
Video-LLaVA and InternVL (tests/llm/golden/llamafactory_video.safetensors, made by make_llamafactory_video.py): frames
sampled with PyAV at video_fps, the expanded `<video>`, the encoded rows and every collated tensor (pixel_values_videos,
video_grid_thw, second_per_grid_ts, mrope position_ids, ...) for rows alone and in pairs, and the tiny model's loss;
and three training steps on video rows against LLaMA-Factory's run_exp (llamafactory_video_train.json).
transformers' video processors need torchvision: those comparisons run in one subprocess with the torchvision test
recipe (tests/llm/torchvision_recipe.py); without torchvision a video row is one line naming it."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("av")
pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def video_files(tmp_path_factory):
    from tests.llm.media_files import write_video_files

    return write_video_files(tmp_path_factory.mktemp("video"))


def test_frames_are_sampled_as_llamafactory_samples_them(video_files):
    """floor(seconds * video_fps) frames spread evenly with numpy's linspace; an odd count repeats the last frame;
    the sampled fps and the frames' timestamps (index / stream fps * video_fps) as LLaMA-Factory reports them."""
    from lathe.llm.multimodal.video import read_video, sample_indices

    assert sample_indices(13, 2.6, 2.0, 128) == [0, 3, 6, 9, 12]
    assert sample_indices(24, 3.0, 2.0, 4) == [0, 7, 15, 23]  # video_maxlen caps the count
    assert sample_indices(0, 0.0, 2.0, 3) == [0, 1, 2]  # a stream that does not know its length
    walk = read_video(str(video_files["walk.mp4"]), 2.0, 128, even=True)
    assert (walk.sample_count, len(walk.frames), walk.duration) == (5, 6, pytest.approx(2.6))
    assert walk.fps == pytest.approx(5 / 2.6) and walk.frames_indices == pytest.approx([0, 1.2, 2.4, 3.6, 4.8])
    assert walk.frames[-1] is walk.frames[-2] and walk.frames[0].size == (64, 48)
    spin = read_video(str(video_files["spin.mp4"]), 2.0, 128)
    assert (len(spin.frames), spin.fps, spin.duration) == (6, pytest.approx(2.0), pytest.approx(3.0))


def test_golden_files_are_the_ones_made_here(video_files):
    import hashlib

    from tests.llm.video_check import golden

    _, metadata = golden()
    for name, path in video_files.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == metadata[f"sha256.{name}"], (
            f"PyAV's {name} differs from the golden's: rerun tests/llm/golden/make_llamafactory_video.py"
        )


@pytest.fixture(scope="module")
def torchvision_results(video_files, tmp_path_factory):
    """video_check.torchvision_checks run once with the torchvision test recipe, for the three tests that read it."""
    pytest.importorskip("transformers")
    from tests.llm.torchvision_recipe import run_with_torchvision

    folder, root = str(next(iter(video_files.values())).parent), str(tmp_path_factory.mktemp("torchvision"))
    code = f"from tests.llm.video_check import torchvision_checks; torchvision_checks({folder!r}, {root!r})"
    return json.loads(run_with_torchvision(code).stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_video_rows_and_batches_equal_llamafactory(torchvision_results):
    checked = torchvision_results["check"]
    assert "error" not in checked, checked["error"] if isinstance(checked, dict) else ""
    assert len(checked) == 36  # 6 model types x (4 rows alone + 2 pairs)


def test_without_torchvision_a_video_row_names_it(video_files, monkeypatch):
    import sys

    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.qwen2_vl import Qwen2VLPlugin
    from tests.llm.multimodal_cases import generator

    monkeypatch.setitem(sys.modules, "torchvision", None)
    gen = generator()
    plugin = Qwen2VLPlugin(gen.make_image_processor(), gen.make_tokenizer(), MediaSettings())
    media = {"video": plugin.regularize("video", [str(video_files["walk.mp4"])], "row 2")}
    with pytest.raises(ValueError, match=r"^a video row needs torchvision .*pip install torchvision"):
        plugin.process_messages([{"role": "user", "content": "<video>hi"}], media)


def test_qwen3_vl_timestamps_are_each_temporal_patchs_mean_time():
    """Qwen3VLProcessor's arithmetic as LLaMA-Factory calls it: indices in units of 1 / video_fps, an odd count
    padded with the last, each pair of frames averaged (walk.mp4 at video_fps 2: frames 0, 3, ... 12 of 5 fps)."""
    from lathe.llm.multimodal.qwen3_vl import frame_timestamps

    assert frame_timestamps([0, 1.2, 2.4, 3.6, 4.8], 2.0, 2) == pytest.approx([0.3, 1.5, 2.4])
    assert frame_timestamps([0, 2, 4, 6], 2.0, 2) == pytest.approx([0.5, 2.5])
    assert frame_timestamps([0, 1, 2], 1.0, 4) == pytest.approx([1.0])


def test_qwen3_vl_is_served_as_qwen2_vl_for_images():
    """Qwen3-VL's module (qwen3_vl.py) keeps the image functions `lathe chat` / `lathe api` serve it with."""
    from lathe.llm.inference.vision import SERVING_FUNCTIONS
    from lathe.llm.multimodal import qwen2_vl
    from lathe.llm.multimodal.plugins import plugin_module

    family = plugin_module("qwen3_vl")
    assert all(getattr(family, name) is getattr(qwen2_vl, name) for name in SERVING_FUNCTIONS)


def test_qwen3_vl_times_each_video_by_its_own_frames(video_files, monkeypatch):
    """Two different videos in one message and in two messages: each run carries its own video's timestamps and
    frame count (LLaMA-Factory 0.9.5 reads them by the message's index: the first video's times for both, or an
    IndexError), as Qwen3VLProcessor writes them."""
    from types import SimpleNamespace

    import lathe.llm.multimodal.qwen2_vl as qwen2_vl
    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.qwen3_vl import Qwen3VLPlugin

    monkeypatch.setattr(qwen2_vl, "check_torchvision", lambda what="": None)  # only the processors' sizes are read
    size = {"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 2 * 16}
    videos = SimpleNamespace(patch_size=16, merge_size=2, temporal_patch_size=2, size=size)
    processor = SimpleNamespace(image_processor=SimpleNamespace(merge_size=2), video_processor=videos)
    plugin = Qwen3VLPlugin(processor, None, MediaSettings(video_max_pixels=48 * 48))
    media = {"video": plugin.regularize("video", [str(video_files[n]) for n in ("walk.mp4", "spin.mp4")], "row 1")}
    run = "<|vision_start|>" + "<|video_pad|>" * 2 + "<|vision_end|>"  # 2 x 4 patches per frame, merged 2x2
    walk = "".join(f"<{t} seconds>{run}" for t in ("0.3", "1.5", "2.4"))  # frames 0, 3, ... 12 at 5 fps
    spin = "".join(f"<{t} seconds>{run}" for t in ("0.2", "1.4", "2.6"))  # frames 0, 4, 9, 13, 18, 23 at 8 fps
    one = plugin.process_messages([{"role": "user", "content": "<video> and <video>"}], media)
    assert one[0]["content"] == f"{walk} and {spin}"
    two = [{"role": "user", "content": "<video>"}, {"role": "assistant", "content": "a"}]
    two = plugin.process_messages([*two, {"role": "user", "content": "<video>"}], media)
    assert (two[0]["content"], two[2]["content"]) == (walk, spin)


@pytest.mark.parametrize("family", ["qwen3_vl", "llava_next_video", "video_llava"])
def test_a_video_family_without_torchvision_names_it(video_files, monkeypatch, family):
    """transformers' video processors are built on torchvision: without it a video row is one line naming it (the
    image rows of these families need no torchvision)."""
    import sys
    from types import SimpleNamespace

    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.plugins import plugin_class

    monkeypatch.setitem(sys.modules, "torchvision", None)
    plugin = plugin_class(family)(SimpleNamespace(image_processor=SimpleNamespace(merge_size=2)), None, MediaSettings())
    media = {"video": plugin.regularize("video", [str(video_files["walk.mp4"])], "row 2")}
    with pytest.raises(ValueError, match=r"^a video row needs torchvision .*pip install torchvision"):
        plugin.process_messages([{"role": "user", "content": "<video>hi"}], media)


def test_intern_vl_refuses_a_video_before_an_image(video_files):
    """LLaMA-Factory (and the model's order) puts a row's image tiles before its video frames: a `<video>` before an
    `<image>` would give each the other's pixels, so the row is refused by name."""
    from types import SimpleNamespace

    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.intern_vl import InternVLPlugin

    plugin = InternVLPlugin(SimpleNamespace(image_seq_length=1), None, MediaSettings())
    media = {"image": ["unused"], "video": plugin.regularize("video", [str(video_files["walk.mp4"])], "row 3")}
    with pytest.raises(ValueError, match="intern_vl family takes a row's images before its videos"):
        plugin.process_messages([{"role": "user", "content": "<video> then <image>"}], media)


@pytest.mark.slow
def test_video_is_served_as_training_encodes_it(torchvision_results):
    """The tiny Qwen2-VL served with a video_url part (tests/llm/video_serving_check.py, in the torchvision
    subprocess) gets the training pipeline's prompt and tensors for the same video (pixel_values_videos,
    video_grid_thw: LLaMA-Factory's frame sampling, 5 frames of walk.mp4 at video_fps 2, the last repeated), and
    greedy tokens equal the model's own generate, alone and beside a text row; lathe api (a media_dir file and a data
    URL), lathe chat's /video and the web chat answer the same. Refusals: test_multimodal_use.py."""
    facts = torchvision_results["serving"]
    assert "error" not in facts, facts.get("error")
    assert facts["media_keys"] == ["pixel_values_videos", "video_grid_thw"]
    assert facts["same_prompt"] and facts["same_tensors"], facts
    assert facts["grid"] == [[3, 2, 2]] and facts["video_tokens"] == 3  # 6 frames / 2, 28x28 frames merged 2x2
    for key in ("greedy_equal", "batched_equal", "api_equal", "chat_equal", "web_equal"):
        assert facts[key] is True, (key, facts)


@pytest.mark.slow
def test_packed_video_rows_train_as_each_row_alone(torchvision_results):
    """neat_packing with video rows (a video; an image and a video; two videos in two turns) in one packed row, for
    Qwen2.5-VL, LLaVA-NeXT-Video and Video-LLaVA: the packed loss is the token-weighted mean of the rows' own, and
    each Qwen2.5-VL example gets the mrope positions it has alone (its grids and second_per_grid_ts)
    (video_check.packing)."""
    results = torchvision_results["packing"]
    assert "error" not in results, results.get("error")
    assert sorted(results) == ["llava_next_video", "qwen2_5_vl", "video_llava"]
    for model_type, result in results.items():
        assert result["packed"] == pytest.approx(result["alone"], rel=1e-5), model_type
    assert results["qwen2_5_vl"]["same_positions"] == 3


@pytest.mark.slow
def test_video_demo_data_goes_through_the_pipeline(torchvision_results):
    """The mllm_video_demo shape (a `<video>` row, a videos column) with the image demo: tokenized by lathe's
    pipeline, collated with an image row, and read by the tiny model (a finite loss)."""
    import math

    out = torchvision_results["pipeline"]
    assert "error" not in out, out.get("error")
    assert out["rows"] == 5 and out["videos"][0].endswith("clip.mp4") and out["pads"] > 0
    assert {"pixel_values_videos", "video_grid_thw", "pixel_values", "position_ids"} <= set(out["keys"])
    assert math.isfinite(out["loss"])


@pytest.mark.slow
def test_lathe_trains_video_rows_as_llamafactory(torchvision_results):
    """Three steps of a video row and an image-and-video row through `lathe train`'s whole pipeline: the tiny Qwen3-VL
    (full tuning with the vision tower frozen, and LoRA), LLaVA-NeXT-Video (full) and Video-LLaVA (full, the towers
    open) against LLaMA-Factory 0.9.5's
    run_exp (tests/llm/golden/llamafactory_video_train.json, made by make_llamafactory_video_train.py): the same
    losses, grad norms and trainable-parameter counts."""
    from pathlib import Path

    from tests.goldens import assert_close_to_golden

    golden = json.loads((Path(__file__).parent / "golden" / "llamafactory_video_train.json").read_text())
    results = torchvision_results["train"]
    assert "error" not in results, results.get("error")
    assert sorted(results) == sorted(name for name in golden if name != "versions")
    for name, ours in results.items():
        expected = golden[name]
        assert (ours["trainable"], ours["total"]) == (expected["trainable"], expected["total"]), name
        assert_close_to_golden(ours["loss"], expected["loss"], f"{name} losses", rel=0, abs=1e-5)
        assert_close_to_golden(ours["grad_norm"], expected["grad_norm"], f"{name} norms", rel=1e-4)
