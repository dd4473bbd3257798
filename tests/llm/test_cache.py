"""The tokenization cache (lathe.llm.data.cache through get_dataset): reused when nothing changed,
rebuilt when anything the rows depend on changed, never published half-written; tokenized_path."""

import json
import os
import shutil
import time
from types import SimpleNamespace

import pytest

from lathe.llm.config.train import DataArguments
from lathe.llm.data import cache, pipeline, processors
from lathe.llm.templates.registry import get_template

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
CALLS = {"batches": 0}


def stand_in_processor(examples, template, tokenizer, data_args):
    """A processor with the contract's signature whose output depends on the tokenizer and cutoff_len."""
    CALLS["batches"] += 1
    ids = []
    for prompt, response in zip(examples["_prompt"], examples["_response"]):
        text = " ".join(message["content"] for message in prompt + response)
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"][: data_args.cutoff_len])
    return {"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids], "labels": ids}


def failing_processor(examples, template, tokenizer, data_args):
    CALLS["batches"] += 1
    if CALLS["batches"] >= 2:
        raise RuntimeError("simulated crash while writing the cache")
    return stand_in_processor(examples, template, tokenizer, data_args)


@pytest.fixture
def env(tmp_path, tiny_tokenizer_dir, monkeypatch):
    """Data and tokenizer copied into tmp_path (so tests may edit them), the stand-in processor."""
    from transformers import AutoTokenizer

    data = tmp_path / "data"
    data.mkdir()
    for name in ("alpaca.json", "sharegpt.json"):
        shutil.copy(os.path.join(DATA_DIR, name), data / name)
    info = {
        "alpaca": {
            "file_name": "alpaca.json",
            "columns": {"prompt": "instruction", "query": "input", "response": "output", "history": "history"},
        },
        "sharegpt": {"file_name": "sharegpt.json", "formatting": "sharegpt"},
    }
    (data / "dataset_info.json").write_text(json.dumps(info))
    tokenizer_dir = tmp_path / "tokenizer"
    shutil.copytree(tiny_tokenizer_dir, tokenizer_dir)
    monkeypatch.setattr(processors, "select_processor", lambda stage, packing, generate=False: stand_in_processor)
    state = SimpleNamespace(
        data=data,
        tokenizer_dir=tokenizer_dir,
        cache_dir=str(tmp_path / "cache"),
        tokenizer=AutoTokenizer.from_pretrained(str(tokenizer_dir)),
        template=get_template("default"),
    )
    state.run = lambda **changes: run(state, **changes)
    return state


def run(state, stage="sft", seed=42, template=None, tokenizer=None, generate=False, **values):
    """get_dataset with the env's defaults; returns (module, built) where built says it tokenized."""
    values = {"dataset": "alpaca", "dataset_dir": str(state.data), "cutoff_len": 64, **values}
    training_args = SimpleNamespace(seed=seed, predict_with_generate=generate)
    before = CALLS["batches"]
    module = pipeline.get_dataset(
        template or state.template,
        SimpleNamespace(),
        DataArguments(**values),
        training_args,
        stage,
        tokenizer or state.tokenizer,
        cache_dir=state.cache_dir,
    )
    return module, CALLS["batches"] > before


def entries(cache_dir):
    return sorted(name for name in os.listdir(cache_dir) if name != "raw")


def test_second_run_reuses_the_cache(env):
    first, built = env.run()
    assert built
    second, built = env.run()
    assert not built
    assert second["train_dataset"].to_list() == first["train_dataset"].to_list()
    assert second["eval_dataset"] is None


def test_arguments_that_cannot_change_the_rows_reuse_the_cache(env, tmp_path):
    env.run()
    assert not env.run(preprocessing_num_workers=1)[1]
    moved = tmp_path / "moved"
    shutil.copytree(env.data, moved)  # the same content elsewhere
    assert not env.run(dataset_dir=str(moved))[1]


@pytest.mark.parametrize(
    "change",
    [
        {"cutoff_len": 8},
        {"train_on_prompt": True},
        {"mask_history": True},
        {"packing": True},
        {"neat_packing": True},
        {"stage": "pt"},
        {"max_samples": 2},
        {"val_size": 1},
        {"seed": 7},
        {"dataset": "alpaca,sharegpt"},
        {"template_name": "chatml"},
        {"default_system": "Be brief."},
        {"tool_format": "qwen"},
        {"generate": True},
    ],
)
def test_any_argument_that_changes_the_rows_rebuilds(env, change):
    env.run()
    change = dict(change)
    if "template_name" in change:
        change["template"] = get_template(change.pop("template_name"))
    if "generate" in change:
        change["val_size"] = 1  # evaluation rows are what predict_with_generate changes
        env.run(val_size=1)
    assert env.run(**change)[1]
    assert not env.run(**change)[1]


def test_template_field_change_rebuilds(env):
    env.run()
    changed = env.template.copy(default_system="another system prompt")
    assert env.run(template=changed)[1]


def test_data_file_content_change_rebuilds(env):
    env.run()
    path = env.data / "alpaca.json"
    rows = json.loads(path.read_text())
    rows[0]["output"] = "five"
    path.write_text(json.dumps(rows))
    module, built = env.run()
    assert built
    assert module["train_dataset"][0]["input_ids"] != env.tokenizer("Add 2 and 3. 5")["input_ids"]


def test_registry_entry_change_rebuilds(env):
    env.run()
    info = json.loads((env.data / "dataset_info.json").read_text())
    del info["alpaca"]["columns"]["history"]  # the history turns are no longer read
    (env.data / "dataset_info.json").write_text(json.dumps(info))
    assert env.run()[1]


def test_tokenizer_file_change_rebuilds(env):
    from transformers import AutoTokenizer

    env.run()
    config_path = env.tokenizer_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["model_max_length"] = 77
    config_path.write_text(json.dumps(config))
    assert env.run(tokenizer=AutoTokenizer.from_pretrained(str(env.tokenizer_dir)))[1]


def test_tokenizer_changed_in_memory_rebuilds(env):
    env.run()
    env.tokenizer.add_tokens(["lathe"])  # e.g. a template adding a stop word as a special token
    assert env.run()[1]


def test_overwrite_cache_forces_tokenizing_and_replaces_the_entry(env):
    env.run()
    assert env.run(overwrite_cache=True)[1]
    assert len(entries(env.cache_dir)) == 1
    assert not env.run()[1]


def test_a_crash_mid_write_leaves_no_reusable_cache(env, monkeypatch):
    monkeypatch.setattr(processors, "select_processor", lambda stage, packing, generate=False: failing_processor)
    CALLS["batches"] = 0
    with pytest.raises(RuntimeError, match="simulated crash"):
        env.run(val_size=1, preprocessing_batch_size=1)  # train batch 1 is written, then the crash
    assert entries(env.cache_dir) == []  # no entry, and the staging folder is gone too
    monkeypatch.setattr(processors, "select_processor", lambda stage, packing, generate=False: stand_in_processor)
    assert env.run(val_size=1, preprocessing_batch_size=1)[1]
    assert not env.run(val_size=1, preprocessing_batch_size=1)[1]


def test_a_crash_before_the_manifest_publishes_nothing(env, monkeypatch):
    def crash(folder, manifest):
        raise OSError("disk full")

    monkeypatch.setattr(cache, "write_manifest", crash)
    with pytest.raises(OSError, match="disk full"):
        env.run()
    assert entries(env.cache_dir) == []


def test_a_killed_run_leaves_a_staging_folder_that_is_never_read(env):
    module, _ = env.run()
    (entry,) = entries(env.cache_dir)
    # What a process killed just before the rename leaves: a complete-looking folder under another name.
    leftover = os.path.join(env.cache_dir, f".tmp-{entry[:12]}-99999-abc")
    shutil.move(os.path.join(env.cache_dir, entry), leftover)
    assert env.run()[1]
    old = time.time() - cache.STALE_TEMPORARY_SECONDS - 10
    os.utime(leftover, (old, old))
    env.run(cutoff_len=9)  # any later write cleans up day-old leftovers
    assert not os.path.exists(leftover)


def test_a_damaged_entry_is_rebuilt(env, caplog):
    env.run()
    (entry,) = entries(env.cache_dir)
    for name in os.listdir(os.path.join(env.cache_dir, entry)):
        if name.endswith(".arrow"):
            os.remove(os.path.join(env.cache_dir, entry, name))
    with caplog.at_level("WARNING", logger="lathe.llm.data"):
        assert env.run()[1]
    assert "is unreadable" in caplog.text


def test_cached_run_repeats_the_skip_report(env, caplog):
    shutil.copy(os.path.join(DATA_DIR, "alpaca_bad.json"), env.data / "alpaca_bad.json")
    info = json.loads((env.data / "dataset_info.json").read_text())
    info["bad"] = {"file_name": "alpaca_bad.json"}
    (env.data / "dataset_info.json").write_text(json.dumps(info))
    env.run(dataset="bad")
    with caplog.at_level("WARNING", logger="lathe.llm.data"):
        assert not env.run(dataset="bad")[1]
    assert "when this cache entry was built, dataset 'bad': skipped 2 of 4 rows" in caplog.text


def test_tokenized_path_saves_then_loads_ignoring_other_arguments(env, tmp_path, caplog):
    path = str(tmp_path / "tokenized")
    first, built = env.run(tokenized_path=path, val_size=1)
    assert built and os.path.isfile(os.path.join(path, "dataset_dict.json"))
    with caplog.at_level("WARNING", logger="lathe.llm.data"):
        second, built = env.run(tokenized_path=path, cutoff_len=4)
    assert not built and "the data arguments are ignored" in caplog.text
    assert second["train_dataset"].to_list() == first["train_dataset"].to_list()
    assert second["eval_dataset"].to_list() == first["eval_dataset"].to_list()


def test_tokenized_path_holding_something_else_is_an_error(env, tmp_path):
    path = tmp_path / "tokenized"
    path.mkdir()
    (path / "notes.txt").write_text("not a dataset")
    with pytest.raises(ValueError, match="exists but holds no saved dataset"):
        env.run(tokenized_path=str(path))
    (tmp_path / "a_file").write_text("keep me")
    with pytest.raises(ValueError, match="is a file; it must name a folder"):
        env.run(tokenized_path=str(tmp_path / "a_file"))
    assert (tmp_path / "a_file").read_text() == "keep me"


def test_several_workers_give_the_same_rows(env):
    one, _ = env.run(val_size=1)
    two, _ = env.run(val_size=1, preprocessing_num_workers=2, overwrite_cache=True)  # map(num_proc=2)
    assert two["train_dataset"].to_list() == one["train_dataset"].to_list()
    assert two["eval_dataset"].to_list() == one["eval_dataset"].to_list()


def test_stable_structure_has_no_memory_addresses():
    class Opaque:
        __slots__ = ()

    described = cache.stable_structure({"f": stand_in_processor, "o": Opaque(), "s": {3, 1}, "t": (1, "a")})
    assert described == {
        "f": f"{__name__}.stand_in_processor",
        "o": f"<{Opaque.__qualname__}>",
        "s": [1, 3],
        "t": [1, "a"],
    }
    assert cache.stable_structure(get_template("qwen")) == cache.stable_structure(get_template("qwen"))
