"""Faults on the new inputs end in one clear line: a reward function returning the wrong type or shape, a
resume with another model, a full disk (ENOSPC) or a file size limit (EFBIG) during a checkpoint write."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from lathe.llm.rl.rewards import RewardFunctionError, compute_rewards
from tests.llm.webui_fixtures import make_root, train_form

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _score(function, count: int = 3):
    prompts = [f"p{i}" for i in range(count)]
    inputs = [{"prompt": p} for p in prompts]
    return compute_rewards([function], ["judge"], [None], inputs, prompts, ["c"] * count, [[1]] * count, {})


@pytest.mark.parametrize(
    "returned, says",
    [
        (0.5, "it returned float 0.5."),
        ("1.0", "it returned str '1.0'."),
        ({"a": 1.0}, "it returned dict {'a': 1.0}."),
        ([1.0, 2.0], "it returned 2 values: [1.0, 2.0]."),
        (["yes", "no", "yes"], "item 0 is str 'yes' (in ['yes', 'no', 'yes'])."),
        ([[1.0], [2.0], [3.0]], "item 0 is list [1.0] (in [[1.0], [2.0], [3.0]])."),
    ],
)
def test_a_reward_of_the_wrong_type_or_shape_names_the_function(returned, says):
    with pytest.raises(RewardFunctionError) as caught:
        _score(lambda **kwargs: returned)
    message = str(caught.value)
    assert message.startswith(
        "reward function 'judge' must return a list[float] of 3 rewards (one per completion, None to skip); "
    )
    assert message.endswith(says), message


def test_rewards_trl_accepts_still_pass():
    assert _score(lambda **kwargs: [1, 0.5, None])[:, 0].tolist()[:2] == [1.0, 0.5]
    assert _score(lambda **kwargs: (True, False, True))[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert _score(lambda **kwargs: torch.tensor([0.25, 0.5, 0.75]))[:, 0].tolist() == [0.25, 0.5, 0.75]


@pytest.fixture
def run_root(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return make_root(tmp_path / "root", tiny_model_dir)


def _config(root: str, path, **values) -> str:
    form = train_form(**values)
    config = {key: value for key, value in form["values"].items()}
    config.update(yaml.safe_load(form["extra"]))
    config.update(finetuning_type="lora", do_train=True, max_steps=4, save_steps=2)
    for key in ("model_name_or_path", "dataset_dir", "output_dir"):
        config[key] = os.path.join(root, config[key])
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_resuming_with_another_model_is_refused(run_root, tmp_path, capsys):
    from lathe.cli import main

    config = _config(run_root, tmp_path / "a.yaml")
    assert main(["train", config, "max_steps=2"]) == 0
    other = os.path.join(run_root, "models", "other")
    shutil.copytree(os.path.join(run_root, "models", "tiny"), other)  # (a link to the same folder is the same model)
    capsys.readouterr()
    assert main(["train", config, f"model_name_or_path={other}", "max_steps=4"]) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("lathe train: error:"))
    assert f"with model_name_or_path '{other}', but that run was trained from" in line
    assert "set allow_model_change: true to resume anyway" in line and "Traceback" not in err
    assert main(["train", config, f"model_name_or_path={other}", "max_steps=4", "allow_model_change=true"]) == 0
    assert os.path.isdir(os.path.join(run_root, "saves", "run1", "checkpoint-4"))


def test_a_full_disk_during_a_checkpoint_names_the_file_and_keeps_the_last(run_root, tmp_path, monkeypatch, capsys):
    from lathe.cli import main
    from lathe.train.checkpoints.layout import is_complete_checkpoint

    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        if "checkpoint-4" in str(path) and str(path).endswith("optimizer.pt"):
            with open(path, "wb") as f:
                f.write(b"\0" * 100)  # part of it, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    assert main(["train", _config(run_root, tmp_path / "a.yaml")]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lathe train: error:")]
    output_dir = os.path.join(run_root, "saves", "run1")
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    checkpoint = os.path.join(output_dir, "checkpoint-4")
    assert lines[0].startswith(f"lathe train: error: [Errno 28] Saving checkpoint '{checkpoint}' failed; earlier ")
    assert lines[0].endswith(
        f"Cause: writing {os.path.join(checkpoint, 'optimizer.pt')}: [Errno 28] No space left on device"
    ), lines[0]
    assert is_complete_checkpoint(os.path.join(output_dir, "checkpoint-2"))
    assert sorted(name for name in os.listdir(output_dir) if "checkpoint" in name) == ["checkpoint-2"]


@pytest.mark.slow  # a whole `lathe train` subprocess
def test_a_file_size_limit_is_one_line(run_root, tmp_path):
    """A real EFBIG: `lathe train` under RLIMIT_FSIZE (ulimit -f) too small for the checkpoint's weights."""
    config = _config(run_root, tmp_path / "a.yaml")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    run = subprocess.run(
        [sys.executable, "-m", "lathe", "train", config, "lora_rank=64"],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    lines = [line for line in run.stderr.splitlines() if line.startswith("lathe train: error:")]
    assert run.returncode == 2 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "File too large" in lines[0] and "checkpoint-2" in lines[0] and "Cause: writing " in lines[0], lines[0]
    assert "earlier checkpoints are intact" in lines[0]
    assert not any("checkpoint" in name for name in os.listdir(os.path.join(run_root, "saves", "run1")))


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory, tiny_model_dir):
    """The tiny model damaged four ways: no tokenizer, a truncated weight file, a config.json with more layers
    than the weights, one with fewer."""
    import json

    base = tmp_path_factory.mktemp("damaged")
    folders = {}
    for name in ("no_tokenizer", "truncated", "more_layers", "fewer_layers"):
        folders[name] = str(base / name)
        shutil.copytree(tiny_model_dir, folders[name])
    for item in os.listdir(folders["no_tokenizer"]):
        if item.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            os.remove(os.path.join(folders["no_tokenizer"], item))
    weights = os.path.join(folders["truncated"], "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    for name, change in (("more_layers", 2), ("fewer_layers", -1)):
        path = os.path.join(folders[name], "config.json")
        config = json.load(open(path))
        config["num_hidden_layers"] += change
        json.dump(config, open(path, "w"))
    return folders


def _load(folder: str):
    from lathe.llm.config.sections import ModelArguments
    from lathe.llm.config.train import FinetuningArguments
    from lathe.llm.model.loader import load_model, load_tokenizer

    arguments = ModelArguments(model_name_or_path=folder)
    return load_model(load_tokenizer(arguments), arguments, FinetuningArguments(finetuning_type="full"), False)


def test_a_model_folder_without_a_tokenizer_is_named(model_folders):
    folder = model_folders["no_tokenizer"]
    with pytest.raises(FileNotFoundError, match=f"^model folder {folder} has no tokenizer \\(none of tokenizer.json"):
        _load(folder)


def test_a_truncated_weight_file_is_named(model_folders):
    path = os.path.join(model_folders["truncated"], "model.safetensors")
    size = os.path.getsize(path)
    with pytest.raises(ValueError, match=f"^weight file {path} is damaged \\(truncated: {size} bytes, its header"):
        _load(model_folders["truncated"])


def test_a_config_that_does_not_match_the_weights_is_an_error_not_a_random_init(model_folders):
    folder = model_folders["more_layers"]
    with pytest.raises(ValueError) as caught:
        _load(folder)
    assert str(caught.value).startswith(
        f"{folder}/config.json does not match the weights in {folder} (model.safetensors): 18 tensors the config "
        "needs are not in the weights (model.layers.3.input_layernorm.weight, "
    ), caught.value
    assert str(caught.value).endswith(
        "Loading would initialise the missing ones at random: fix config.json or the weights."
    )
    folder = model_folders["fewer_layers"]
    with pytest.raises(ValueError, match="9 tensors in the weights have no place in the model \\(model.layers.2."):
        _load(folder)


def test_an_undecodable_or_truncated_image_names_the_file_and_the_row(tmp_path, capsys, monkeypatch):
    from lathe.cli import main
    from tests.llm import multimodal_cases as cases

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model, data = cases.make_model_folder(tmp_path / "model"), cases.make_data_folder(tmp_path / "data")
    rows = json.loads((data / "mllm_demo.json").read_text())
    row = next(index for index, item in enumerate(rows) if item["images"])
    image = data / rows[row]["images"][0]
    assert image.is_file(), image
    content = image.read_bytes()
    image.write_bytes(content[: len(content) // 2])  # truncated
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cases.train_config(model, data, tmp_path / "out", max_steps=1)))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lathe train: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert f"image file '{image}' cannot be decoded" in lines[0] and f"dataset row {row + 1}" in lines[0], lines[0]


def test_a_truncated_wav_names_the_file(tmp_path):
    import wave

    from lathe.llm.multimodal.audio import decode_audio
    from lathe.llm.multimodal.images import UndecodableMedia

    path = str(tmp_path / "a.wav")
    with wave.open(path, "wb") as f:
        f.setnchannels(1), f.setsampwidth(2), f.setframerate(16000)
        f.writeframes(b"\1\0" * 1600)
    assert decode_audio(path)[0].shape == (1, 1600)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1001)
    with pytest.raises(UndecodableMedia, match=f"audio file '{path}' is truncated \\(1099 of 1600 samples\\)"):
        decode_audio(path)


@pytest.mark.slow  # a whole `lathe train` subprocess
def test_a_stage_that_cannot_run_on_several_processes_says_so_last(run_root, tmp_path):
    """Under torchrun, each rank's one-line error comes after torchrun's ChildFailedError report."""
    config = _config(run_root, tmp_path / "a.yaml")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lathe",
            "train",
            config,
            "nproc_per_node=2",
            "use_badam=true",
            "finetuning_type=full",
            "master_port=0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"},
    )
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode != 0 and "several-process BAdam" in lines[-1], run.stderr[-3000:]
    assert lines[-1].startswith("lathe train: error: use_badam (in ") and lines[-1].endswith(
        "runs in one process here: LLaMA-Factory's several-process BAdam needs DeepSpeed ZeRO-3 hooks that lathe's "
        "ZeRO integration does not install."
    ), run.stderr[-3000:]
    assert any("ChildFailedError" in line or "FAILED" in line for line in lines[:-1]), run.stderr[-3000:]
