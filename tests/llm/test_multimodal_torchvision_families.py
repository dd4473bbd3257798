"""The families whose transformers processors need torchvision, through their real processors, against LLaMA-Factory
0.9.5 (tests/llm/golden/llamafactory_torchvision_families.safetensors, made by
make_llamafactory_torchvision_families.py): Llama 4 (Llama4Processor's tiles), LFM2-VL (Lfm2VlProcessor), Pixtral as
Mistral-Small 3.x (Mistral3, 2x2 patch merge) and as Pixtral-12B (LLaVA), InternVL (InternVLProcessor; also
crop_to_patches) image rows alone and in pairs (the stand-in white image included): the expanded messages, ids,
labels, every collated tensor (integers exactly, pixels 1e-5) and the tiny model's loss; and `lathe train`'s three
steps (full and LoRA; an InternVL image-and-video row, full) against LLaMA-Factory's run_exp: losses 1e-5, grad norms
1e-4 relative, trainable and total counts exactly. Everything runs in one subprocess with the torchvision test recipe
(tests/llm/torchvision_recipe.py)."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """torchvision_families_check.run once for the tests below (one start of torch, transformers and torchvision)."""
    pytest.importorskip("transformers")
    from tests.llm.torchvision_recipe import run_with_torchvision

    folder = tmp_path_factory.mktemp("videos")  # the compared rows are image rows: no video file is read
    root = str(tmp_path_factory.mktemp("torchvision_families"))
    code = f"from tests.llm.torchvision_families_check import run; run({str(folder)!r}, {root!r})"
    return json.loads(run_with_torchvision(code).stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def golden():
    from tests.llm.torchvision_families_check import GEN
    from tests.llm.video_check import golden as read

    return read(GEN.GOLDEN)


def test_rows_and_batches_equal_llamafactory(results, golden):
    _, metadata = golden
    versions = json.loads(metadata["versions"])
    assert (versions["llamafactory"], versions["transformers"]) == ("0.9.5", "5.6.0")
    checked = results["check"]
    assert "error" not in checked, checked["error"] if isinstance(checked, dict) else ""
    families = {name.split(".")[0] for name in checked}
    assert families == {"llama4", "lfm2_vl", "pixtral", "pixtral_llava", "intern_vl", "intern_vl_crop"}
    assert len(checked) == 5 * 6 + 3  # 4 rows alone and 2 pairs each; intern_vl_crop's 2 rows and their pair


def test_lathe_trains_as_llamafactory(results, golden):
    """Llama 4: the frozen vision tower takes the processor's bfloat16 pixels cast to the compute dtype (LLaMA-Factory's
    sft collator casts them); LoRA `all` leaves Llama4Router out (an nn.Linear subclass returning a tuple). LFM2-VL:
    no composite model, yet its batches carry the image tensors. Pixtral (mistral3 and llava composites) and InternVL
    (images; a row with an image and a video, then a text-only row) train as LLaMA-Factory with no lathe change."""
    from tests.goldens import assert_close_to_golden

    expected_runs = json.loads(golden[1]["train"])
    ours = results["train"]
    assert "error" not in ours, ours.get("error")
    assert sorted(ours) == sorted(expected_runs)
    for name, run in ours.items():
        expected = expected_runs[name]
        assert (run["trainable"], run["total"]) == (expected["trainable"], expected["total"]), name
        assert_close_to_golden(run["loss"], expected["loss"], f"{name} losses", rel=0, abs=1e-5)
        assert_close_to_golden(run["grad_norm"], expected["grad_norm"], f"{name} norms", rel=1e-4)


@pytest.mark.parametrize("family", ["glm4v", "ernie_vl"])
def test_video_rows_of_glm4v_and_ernie_vl_are_refused(golden, family):
    """LLaMA-Factory 0.9.5 fails on every GLM-4.1V and ERNIE-4.5-VL video row with transformers 5 (recorded by the
    golden's generator with the real video processors: the images=None call; GLM's VideoMetadata key; ERNIE's
    token count twice what the model reads, so its positions do not fit): lathe refuses such a row in one line
    naming the family and why, instead of training it as something else."""
    from types import SimpleNamespace

    from lathe.llm.multimodal.base import MediaSettings
    from lathe.llm.multimodal.plugins import plugin_class

    _, metadata = golden
    assert "unexpected keyword argument 'images'" in metadata[f"{family}.video_error"]
    after_bridge = {"glm4v": "VideoMetadata.__init__() got an unexpected keyword argument 'total_frames'"}
    after_bridge["ernie_vl"] = "shape mismatch"  # the collator's get_rope_index on LLaMA-Factory's token count
    assert after_bridge[family] in metadata[f"{family}.error"]
    plugin = plugin_class(family)(SimpleNamespace(image_processor=None), None, MediaSettings())
    with pytest.raises(
        ValueError,
        match=rf"^row 2: 1 video\(s\) given, but lathe's {family} family takes no video.*"
        "LLaMA-Factory 0.9.5 fails",
    ):
        plugin.check_kinds({"video": 1}, "row 2")
