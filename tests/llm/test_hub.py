"""Hub ids (model_name_or_path, adapter_name_or_path, hf_hub_url datasets) found in a Hugging Face cache laid out
as the Hub leaves it (tests/llm/hub_cache.py), offline; and the one-line error when nothing is cached."""

import json
import os
import subprocess
import sys

import pytest
import torch

from lathe.llm.config import parse_train_config
from lathe.llm.hub import is_repo_id, resolve_folder
from lathe.llm.model.loader import load_model, load_tokenizer
from lathe.llm.workflows.plan import format_config
from tests.llm.hub_cache import put_in_hub_cache

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hub cache, with huggingface_hub offline (its constants are read once, at import)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def _config(model, **values):
    return parse_train_config({"model_name_or_path": model, "dataset": "d", "output_dir": "unused", **values})


def _logits(model):
    with torch.no_grad():
        return model(input_ids=torch.arange(1, 9).unsqueeze(0)).logits


def _load(config, is_trainable=False):
    tokenizer = load_tokenizer(config.model)
    return tokenizer, load_model(tokenizer, config.model, config.finetuning, is_trainable=is_trainable)


def test_repo_ids_and_paths_are_told_apart():
    assert is_repo_id("Qwen/Qwen3-4B-Instruct-2507") and is_repo_id("gpt2")
    for path in ("./models/x", "/abs/x", "saves/qwen3/lora/sft", "../x", "a--b/c", "x/"):
        assert not is_repo_id(path), path


def test_hub_id_loads_the_cached_snapshot_offline(hub_cache, tiny_model_dir):
    snapshot = put_in_hub_cache(tiny_model_dir, hub_cache, "Org/Tiny")
    _, from_hub = _load(_config("Org/Tiny", finetuning_type="full"))
    _, from_folder = _load(_config(snapshot, finetuning_type="full"))
    assert torch.equal(_logits(from_hub), _logits(from_folder))
    # The name stays the hub id (what peft writes as an adapter's base model), as when transformers downloads it.
    assert from_hub.name_or_path == from_hub.config._name_or_path == "Org/Tiny"


def test_cache_dir_key_names_the_cache(tmp_path, hub_cache, tiny_model_dir):
    other = tmp_path / "elsewhere"
    put_in_hub_cache(tiny_model_dir, other, "Org/Tiny")
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache"):
        load_tokenizer(_config("Org/Tiny").model)  # not in the default cache
    tokenizer = load_tokenizer(_config("Org/Tiny", cache_dir=str(other)).model)
    assert tokenizer.eos_token == "</s>"


def test_model_revision_picks_that_snapshot(tmp_path, hub_cache, tiny_model_dir):
    import shutil

    from transformers import AutoModelForCausalLM

    put_in_hub_cache(tiny_model_dir, hub_cache, "Org/Tiny")
    changed = tmp_path / "v2"
    shutil.copytree(tiny_model_dir, changed)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    model.save_pretrained(changed)
    commit = "b" * 40
    put_in_hub_cache(changed, hub_cache, "Org/Tiny", revision="v2", commit=commit)

    main = _logits(_load(_config("Org/Tiny", finetuning_type="full"))[1])
    for revision in ("v2", commit):
        tagged = _logits(_load(_config("Org/Tiny", finetuning_type="full", model_revision=revision))[1])
        assert torch.allclose(tagged, 2 * main, atol=1e-5), revision
    with pytest.raises(FileNotFoundError, match=r"\(revision v3\).*hf download Org/Tiny --revision v3"):
        load_tokenizer(_config("Org/Tiny", model_revision="v3").model)


def test_adapter_from_the_hub_cache_is_merged(tmp_path, hub_cache, tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    put_in_hub_cache(tiny_model_dir, hub_cache, "Org/Tiny")
    torch.manual_seed(1)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    put_in_hub_cache(tmp_path / "adapter", hub_cache, "Org/Tiny-LoRA")

    base = _logits(_load(_config("Org/Tiny", finetuning_type="full"))[1])
    merged = _logits(_load(_config("Org/Tiny", adapter_name_or_path="Org/Tiny-LoRA"))[1])
    local = _logits(_load(_config(tiny_model_dir, adapter_name_or_path=str(tmp_path / "adapter")))[1])
    assert torch.allclose(merged, local, atol=1e-6)
    assert (merged - base).abs().max() > 1e-3  # the adapter was applied


def test_hub_dataset_is_read_from_its_cached_repository(tmp_path, hub_cache, tiny_model_dir):
    from lathe.llm.data.pipeline import get_dataset
    from lathe.llm.templates import get_template_and_fix_tokenizer

    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    rows = [{"instruction": f"add {i} and {i}", "input": "", "output": str(2 * i)} for i in range(6)]
    (repo / "data" / "train.json").write_text(json.dumps(rows[:4]))
    (repo / "data" / "test.json").write_text(json.dumps(rows[4:]))
    (repo / "README.md").write_text("# stand-in\n")
    put_in_hub_cache(repo, hub_cache, "Org/Sums", repo_type="dataset")
    data_dir = tmp_path / "registry"
    data_dir.mkdir()
    (data_dir / "dataset_info.json").write_text(
        json.dumps({"sums": {"hf_hub_url": "Org/Sums"}, "sums_test": {"hf_hub_url": "Org/Sums", "split": "test"}})
    )
    for name, expected in (("sums", rows[:4]), ("sums_test", rows[4:])):
        config = _config(tiny_model_dir, dataset=name, dataset_dir=str(data_dir), template="chatml")
        tokenizer = load_tokenizer(config.model)
        template = get_template_and_fix_tokenizer(tokenizer, config.data)
        train = get_dataset(
            template, config.model, config.data, config.training, "sft", tokenizer, cache_dir=str(tmp_path / "c")
        )["train_dataset"]
        texts = sorted(tokenizer.decode(row["input_ids"]) for row in train)
        assert len(texts) == len(expected)
        assert all(any(row["instruction"] in text for text in texts) for row in expected)
    (data_dir / "dataset_info.json").write_text(json.dumps({"gone": {"hf_hub_url": "Org/Gone"}}))
    config = _config(tiny_model_dir, dataset="gone", dataset_dir=str(data_dir), template="chatml")
    with pytest.raises(
        FileNotFoundError, match="dataset 'gone': hf_hub_url 'Org/Gone' .*hf download Org/Gone --repo-type dataset"
    ):
        get_dataset(
            template, config.model, config.data, config.training, "sft", tokenizer, cache_dir=str(tmp_path / "c")
        )


def test_ref_model_from_the_hub_cache(hub_cache, tiny_model_dir):
    from lathe.llm.hub import resolve_config
    from lathe.llm.preference.reference import create_reference_model

    put_in_hub_cache(tiny_model_dir, hub_cache, "Org/Tiny")
    values = {"stage": "dpo", "finetuning_type": "full", "pref_loss": "sigmoid"}
    missing = _config(tiny_model_dir, ref_model="Org/Ref", **values)
    with pytest.raises(FileNotFoundError, match="ref_model 'Org/Ref' is not a local folder .*hf download Org/Ref"):
        resolve_config(missing)
    config = _config(tiny_model_dir, ref_model="Org/Tiny", **values)
    resolve_config(config)
    tokenizer = load_tokenizer(config.model)
    reference = create_reference_model(tokenizer, config.model, config.finetuning)
    assert reference.name_or_path == "Org/Tiny" and not any(p.requires_grad for p in reference.parameters())
    assert torch.equal(_logits(reference), _logits(_load(_config(tiny_model_dir, finetuning_type="full"))[1]))


def test_token_is_never_printed(tiny_model_dir):
    config = _config(tiny_model_dir, hf_hub_token="hf_secret123")
    assert config.model.hf_hub_token == "hf_secret123"
    assert "hf_secret123" not in format_config(config)
    assert "hf_secret123" not in json.dumps(config.to_dict())


def test_modelscope_needs_its_package_and_openmind_is_refused(hub_cache, monkeypatch):
    pytest.importorskip("torch")
    if __import__("importlib").util.find_spec("modelscope") is None:
        monkeypatch.setenv("USE_MODELSCOPE_HUB", "1")
        with pytest.raises(ImportError, match="pip install modelscope"):
            load_tokenizer(_config("Org/Tiny").model)
        monkeypatch.delenv("USE_MODELSCOPE_HUB")
    monkeypatch.setenv("USE_OPENMIND_HUB", "1")
    with pytest.raises(ValueError, match="openmind hub is not supported"):
        load_tokenizer(_config("Org/Tiny").model)


def test_a_path_that_is_no_folder_nor_id_says_so(tmp_path):
    from lathe.llm.hub import HubOptions

    with pytest.raises(FileNotFoundError, match="is not a local folder"):
        resolve_folder(str(tmp_path / "nope"), HubOptions())


@pytest.mark.parametrize("launch", [{}, {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"}], ids=["one", "torchrun"])
def test_offline_and_not_cached_is_one_line_before_the_configuration(tmp_path, write_yaml, launch):
    config = write_yaml(
        tmp_path / "c.yaml",
        {
            "model_name_or_path": "Qwen/Qwen3-4B-Instruct-2507",
            "stage": "sft",
            "do_train": True,
            "finetuning_type": "lora",
            "dataset": "d",
            "template": "qwen3_nothink",
            "output_dir": str(tmp_path / "out"),
        },
    )
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), **launch)
    env.pop("HF_HUB_CACHE", None)
    result = subprocess.run(
        [sys.executable, "-m", "lathe", "train", config], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 2
    assert "Configuration" not in result.stdout  # stopped before the configuration dump
    assert "process(es) per node" not in result.stdout  # and, under torchrun, before the ranks start
    errors = [line for line in result.stderr.splitlines() if line.startswith("lathe train: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert "'Qwen/Qwen3-4B-Instruct-2507'" in errors[0]
    assert "`hf download Qwen/Qwen3-4B-Instruct-2507`" in errors[0] and "unset HF_HUB_OFFLINE" in errors[0]
    assert str(tmp_path / "hf" / "hub") in errors[0]  # the cache it looked in


ONLINE_SCRIPT = """
import sys
from lathe.llm.config import parse_train_config
from lathe.llm.hub import resolve_config
from lathe.llm.model.loader import load_model, load_tokenizer
config = parse_train_config({"model_name_or_path": sys.argv[1], "adapter_name_or_path": sys.argv[2], "dataset": "d",
                             "output_dir": "unused", "hf_hub_token": sys.argv[3]})
resolve_config(config)
tokenizer = load_tokenizer(config.model)
model = load_model(tokenizer, config.model, config.finetuning)
print("loaded", model.name_or_path)
from lathe.llm.data.registry import get_dataset_list, resolve_data_files
from lathe.llm.hub import resolve_hub_datasets
attrs = get_dataset_list(["sums"], {"sums": {"hf_hub_url": "Org/Sums"}})
resolve_hub_datasets(attrs, config.model)
print("dataset files", [path.rsplit("/", 2)[-2:] for path in resolve_data_files(attrs[0], "unused")[0]])
"""


@pytest.mark.slow
def test_hub_ids_download_from_an_endpoint_into_the_cache(tmp_path, tiny_model_dir):
    """Online through HF_ENDPOINT (a local stand-in of the Hub): the model and the adapter land in the cache in
    the Hub's layout, an unused weight format is not downloaded, hf_hub_token is sent (over HF_TOKEN, as
    LLaMA-Factory passes it to transformers), and afterwards they load offline."""
    import shutil

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tests.llm.hub_server import HubStandIn

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "original").mkdir()
    (model / "original" / "consolidated.00.pth").write_bytes(b"weights for another program")
    (model / "pytorch_model.bin").write_bytes(b"a second copy of the weights")
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj"])
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1", HF_TOKEN="hf_env")
    for key in ("HF_HUB_CACHE", "HF_HUB_OFFLINE"):
        env.pop(key, None)
    with HubStandIn() as hub:
        hub.add_folder(model, "Org/Tiny")
        hub.add_folder(tmp_path / "adapter", "Org/Tiny-LoRA", commit="d" * 40)
        (tmp_path / "sums" / "data").mkdir(parents=True)
        (tmp_path / "sums" / "data" / "train.json").write_text('[{"instruction": "1+1", "output": "2"}]')
        hub.add_folder(tmp_path / "sums", "Org/Sums", repo_type="dataset", commit="e" * 40)
        env["HF_ENDPOINT"] = hub.url
        command = [sys.executable, "-c", ONLINE_SCRIPT, "Org/Tiny", "Org/Tiny-LoRA", "hf_key"]
        online = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert online.returncode == 0, online.stderr[-3000:]
        downloaded = {
            request.split("/resolve/" + "c" * 40 + "/")[-1] for request in hub.requests if "GET /Org/Tiny/" in request
        }
    assert "loaded Org/Tiny" in online.stdout
    assert "dataset files [['data', 'train.json']]" in online.stdout
    assert hub.authorizations <= {"Bearer hf_key", None} and "Bearer hf_key" in hub.authorizations
    snapshot = tmp_path / "hf" / "hub" / "models--Org--Tiny" / "snapshots" / ("c" * 40)
    assert (snapshot / "model.safetensors").is_file() and (snapshot / "config.json").is_file()
    assert "model.safetensors" in downloaded
    assert not {"pytorch_model.bin", "original/consolidated.00.pth"} & downloaded  # transformers reads safetensors
    assert (tmp_path / "hf" / "hub" / "models--Org--Tiny-LoRA" / "refs" / "main").read_text() == "d" * 40
    # The server is gone: the cache serves both, offline.
    offline = subprocess.run(command, capture_output=True, text=True, env=dict(env, HF_HUB_OFFLINE="1"), timeout=300)
    assert offline.returncode == 0, offline.stderr[-3000:]
    assert "dataset files [['data', 'train.json']]" in offline.stdout


def test_use_modelscope_hub_downloads_through_modelscope(tmp_path, hub_cache, monkeypatch, tiny_model_dir):
    """USE_MODELSCOPE_HUB=1: names go to modelscope's snapshot_download (a stand-in module here), with
    ModelScope's default branch for main, cache_dir, and ms_hub_url chosen over hf_hub_url for datasets."""
    import types

    from lathe.llm.data.registry import get_dataset_list
    from lathe.llm.hub import resolve_hub_datasets

    calls = []

    def snapshot_download(name, revision=None, cache_dir=None, repo_type=None):
        calls.append((name, revision, cache_dir, repo_type))
        return tiny_model_dir

    package = types.ModuleType("modelscope")
    hub = types.ModuleType("modelscope.hub")
    module = types.ModuleType("modelscope.hub.snapshot_download")
    module.snapshot_download = snapshot_download
    for name, value in (("modelscope", package), ("modelscope.hub", hub), ("modelscope.hub.snapshot_download", module)):
        monkeypatch.setitem(sys.modules, name, value)
    monkeypatch.setenv("USE_MODELSCOPE_HUB", "1")

    config = _config("Qwen/Qwen3-0.6B", cache_dir=str(tmp_path / "ms"))
    assert load_tokenizer(config.model).eos_token == "</s>"
    assert calls == [("Qwen/Qwen3-0.6B", "master", str(tmp_path / "ms"), "model")]
    load_tokenizer(_config("Qwen/Qwen3-0.6B", model_revision="v1.0").model)
    assert calls[-1][:2] == ("Qwen/Qwen3-0.6B", "v1.0")

    registry = {"both": {"hf_hub_url": "hf/data", "ms_hub_url": "ms/data"}}
    (attr,) = get_dataset_list(["both"], registry)
    resolve_hub_datasets([attr], config.model)
    assert calls[-1] == ("ms/data", "master", str(tmp_path / "ms"), "dataset") and attr.snapshot == tiny_model_dir
