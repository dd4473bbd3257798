"""One root for every path the web page handles: every path-valued config key (derived from the config
dataclasses, so a new one without the check fails here), in a form field and in the all-keys editor, a
dataset_info.json's file_name (uploaded or already there) and reward_funcs modules: `..`, absolute paths and
links out of the root are a 403 naming the key; the same values under the root pass."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from lathe.llm.webui.paths import PATH_KEYS, is_path_key  # noqa: E402
from tests.llm.webui_fixtures import make_root, train_form  # noqa: E402

# Keys whose name or help mentions a file, folder or path but that hold none (module names, flags).
NOT_PATHS = {
    "trust_remote_code": "a flag",
    "export_gguf": "GGUF type names (f16, q8_0, ...); the files go into export_dir, which is checked",
    "freeze_trainable_modules": "module names",
    "freeze_extra_modules": "module names",
    "lora_target": "module names",
    "module_dropout": "a probability",
    "optim_target_modules": "module names",
    "overwrite_output_dir": "a flag",
    "freeze_language_model": "a flag",
    "use_ref_model": "a flag",
    "save_only_model": "a flag",
    "metric_for_best_model": "a metric name",
    "liger_kernel_config": "a dict of kernel switches",
    "parallelism_config": "an object (not supported)",
}


def config_keys() -> dict[str, str]:
    """Every key `lathe train` / `lathe export` read, with its help text."""
    from lathe.llm.config.sections import DataArguments, ModelArguments
    from lathe.llm.config.train import FinetuningArguments, GeneratingArguments, training_arguments_class
    from lathe.llm.inference.config import ExportArguments

    keys = {}
    for section in (ModelArguments, DataArguments, FinetuningArguments, GeneratingArguments, ExportArguments):
        keys.update({f.name: str(f.metadata.get("help", "")) for f in dataclasses.fields(section)})
    keys.update({f.name: str(f.metadata.get("help", "")) for f in dataclasses.fields(training_arguments_class())})
    return keys


def path_valued_keys() -> list[str]:
    found = [
        key
        for key, help in config_keys().items()
        if re.search(r"path|_dir$|file|folder|config$|_model$", key)
        or re.search(r"\b(folders?|files?|paths?|director(y|ies))\b", help, re.IGNORECASE)
    ]
    return sorted(key for key in found if key not in NOT_PATHS)


def test_every_path_valued_key_is_checked():
    keys = path_valued_keys()
    assert len(keys) >= 15, keys  # the classification found the keys (model, data, training, export)
    assert [key for key in keys if not is_path_key(key)] == []
    assert set(NOT_PATHS) <= set(config_keys())  # no stale exception


@pytest.fixture
def root(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = make_root(tmp_path / "root", tiny_model_dir)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    (outside / "rewards.py").write_text("def f(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    os.symlink(outside, os.path.join(root, "link"))
    return root


@pytest.fixture
def client(root):
    from lathe.llm.webui.server import create_app

    return TestClient(create_app(root), base_url="http://localhost")


HOSTILE = ["../outside/secret.json", "/etc/passwd", "link/secret.json", "data/../../outside/secret.json"]


@pytest.mark.parametrize("key", sorted(set(path_valued_keys()) | PATH_KEYS))
@pytest.mark.parametrize("where", ["field", "editor"])
def test_each_path_key_is_confined(client, key, where):
    for value in HOSTILE:
        form = train_form()
        if where == "field":
            form["values"][key] = value
        else:
            form["extra"] += f"{key}: {json.dumps(value)}\n"
        reply = client.post("/api/config", json=form)
        assert reply.status_code == 403, (key, value, reply.text)
        assert key in reply.json()["error"] and "outside the web page's root" in reply.json()["error"], reply.text


def test_paths_under_the_root_pass(client, root):
    os.makedirs(os.path.join(root, "ds"))
    open(os.path.join(root, "ds", "z2.json"), "w").write("{}")
    open(os.path.join(root, "rewards.py"), "w").write("def f(completions, **kwargs):\n    return [0.0]\n")
    form = train_form(deepspeed="ds/z2.json", fsdp_config='{"min_num_params": 1}', tokenized_path="cache/tok")
    form["extra"] += "reward_funcs: rewards:f\nlogging_dir: saves/run1/tb\n"
    reply = client.post("/api/config", json=form)
    assert reply.status_code == 200, reply.text
    text = reply.json()["yaml"]
    assert f"deepspeed: {os.path.join(os.path.realpath(root), 'ds', 'z2.json')}" in text
    assert "rewards:f" in text and "min_num_params" in text


@pytest.mark.parametrize("spec", ["os:system", "link.rewards:f", "outside.rewards:f", "../outside/rewards:f"])
def test_reward_code_comes_from_the_root_only(client, spec):
    form = train_form()
    form["extra"] += f"reward_funcs: {json.dumps(spec)}\n"
    reply = client.post("/api/config", json=form)
    assert reply.status_code == 403 and "reward_funcs" in reply.json()["error"], reply.text


@pytest.mark.parametrize(
    "key, value",
    [
        ("tools", "os:system"),
        ("tools", ["rewards:f", "subprocess:getoutput"]),
        ("rollout_func", "outside.rewards:f"),
        ("environment_factory", "os:PathLike"),
        ("environment_factory", {"ok": "rewards:f", "evil": "shutil:rmtree"}),
    ],
)
def test_a_runs_other_code_comes_from_the_root_only(client, root, key, value):
    """GRPO's tools, rollout_func and environment_factory name code `lathe train` imports, like reward_funcs: the
    page accepts .py modules under its root only (a module under the root passes, next to a refused one)."""
    open(os.path.join(root, "rewards.py"), "w").write("def f(completions, **kwargs):\n    return [0.0]\n")
    form = train_form()
    form["extra"] += f"{key}: {json.dumps(value)}\n"
    reply = client.post("/api/config", json=form)
    assert reply.status_code == 403 and key in reply.json()["error"], reply.text
    assert "not a .py file under the web page's root" in reply.json()["error"], reply.text
    form = train_form()
    form["extra"] += f"{key}: {json.dumps(['rewards:f'] if key == 'tools' else 'rewards:f')}\n"
    assert client.post("/api/config", json=form).status_code == 200


@pytest.mark.parametrize("file_name", ["../../outside/secret.json", "/etc/passwd", "../link/secret.json"])
def test_dataset_files_stay_under_the_root(client, root, file_name):
    info = json.dumps({"evil": {"file_name": file_name}}).encode()
    reply = client.post("/api/upload?name=dataset_info.json", content=info)
    assert reply.status_code == 403 and "'evil' file_name" in reply.json()["error"], reply.text
    saved = json.load(open(os.path.join(root, "data", "dataset_info.json")))
    assert saved == {"add": {"file_name": "add.json"}}  # nothing written
    with open(os.path.join(root, "data", "dataset_info.json"), "w") as f:  # placed there another way
        json.dump({"add": {"file_name": "add.json"}, "evil": {"file_name": file_name}}, f)
    reply = client.post("/api/config", json=train_form(dataset="add,evil"))
    assert reply.status_code == 403 and "'evil' file_name" in reply.json()["error"], reply.text
    assert client.post("/api/config", json=train_form(dataset="add")).status_code == 200
    good = json.dumps({"add": {"file_name": "add.json"}, "hub": {"hf_hub_url": "org/data"}}).encode()
    assert client.post("/api/upload?name=dataset_info.json", content=good).status_code == 200


def test_media_files_in_data_rows_stay_under_the_root_for_runs_the_page_starts(root, monkeypatch):
    from lathe.llm.multimodal.media import MediaProblem, resolve_path
    from lathe.llm.webui.jobs import child_environment

    os.makedirs(os.path.join(root, "data", "images"))
    open(os.path.join(root, "data", "images", "a.png"), "wb").write(b"x")
    outside = os.path.join(os.path.dirname(root), "outside", "secret.json")
    media_dir = os.path.join(root, "data")
    assert resolve_path(outside, media_dir, "image") == outside  # the command line: LLaMA-Factory's rule
    monkeypatch.setenv("LATHE_MEDIA_ROOT", child_environment(root)["LATHE_MEDIA_ROOT"])
    assert resolve_path("images/a.png", media_dir, "image") == os.path.join(media_dir, "images/a.png")
    for item in (outside, "../../outside/secret.json", "../link/secret.json"):
        with pytest.raises(MediaProblem, match="is outside the web page's root"):
            resolve_path(item, media_dir, "image")
