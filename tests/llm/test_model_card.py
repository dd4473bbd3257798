"""The model card (README.md) LLaMA-Factory 0.9.5 leaves beside every trained model: transformers' card
with license "other", task text-generation, the base model, the datasets and the tags llama-factory and
the finetuning type, for every stage and method (merged into PEFT's adapter card for LoRA)."""

import json
import shutil

import pytest
import yaml

from tests.llm.golden.make_llamafactory_preference import BASE, DATA_DIR, build_model

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
DATASETS = {"pt": "docs", "sft": "add", "rm": "pairs_alpaca", "dpo": "pairs_alpaca,pairs_sharegpt", "kto": "feedback"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("model_card")
    build_model(root / "model", seed=0)
    data = root / "data"
    shutil.copytree(DATA_DIR, data)
    info = json.loads((data / "dataset_info.json").read_text())
    rows = [{"instruction": f"What is {a} plus 2?", "input": "", "output": f"{a + 2}."} for a in range(8)]
    (data / "add.json").write_text(json.dumps(rows))
    (data / "docs.txt").write_text("\n".join(f"The quick brown fox jumps over the lazy dog {i}." for i in range(8)))
    info.update(add={"file_name": "add.json"}, docs={"file_name": "docs.txt", "columns": {"prompt": "text"}})
    (data / "dataset_info.json").write_text(json.dumps(info))
    return root


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.getbasetemp() / "home"))


def front_matter(path) -> dict:
    return yaml.safe_load(path.read_text().split("---", 2)[1])


@pytest.mark.parametrize("method", ["full", "freeze", "lora"])
@pytest.mark.parametrize("stage", ["pt", "sft", "rm", "dpo", "kto"])
def test_every_stage_and_method_writes_llamafactory_s_card(folders, tmp_path, stage, method):
    from lathe.llm.commands import run_train
    from lathe.llm.config.train import parse_train_config

    output = tmp_path / "out"
    values = {
        **BASE,
        "dataset_dir": str(folders / "data"),
        "model_name_or_path": str(folders / "model"),
        "stage": stage,
        "finetuning_type": method,
        "dataset": DATASETS[stage],
        "max_steps": 1,
        "freeze_trainable_layers": 1,
        "output_dir": str(output),
    }
    run_train(parse_train_config(values))
    card = front_matter(output / "README.md")
    assert card["license"] == "other"
    assert card["base_model"] == str(folders / "model")
    if method != "lora":
        assert {"llama-factory", method, "generated_from_trainer"} <= set(card["tags"])
    assert card["model-index"] == [{"name": "out", "results": []}] or method == "lora"
    text = (output / "README.md").read_text()
    names = DATASETS[stage].split(",")
    assert (
        f"on the {names[0]} dataset." if len(names) == 1 else f"on the {names[0]} and the {names[1]} datasets."
    ) in text
    assert "- Transformers " in text and "### Training hyperparameters" in text
    if method == "lora":  # PEFT's adapter card, updated by PEFT after transformers' card (the reward model's too)
        assert card["library_name"] == "peft" and card["pipeline_tag"] == "text-generation"
        adapter = "base_model:adapter:" + str(folders / "model")
        assert {"llama-factory", "lora", adapter, "transformers"} <= set(card["tags"]), card["tags"]
        assert "generated_from_trainer" not in card["tags"]  # as in LLaMA-Factory's card of an rm lora run
    else:
        assert card["library_name"] == "transformers"


def test_no_card_without_training(folders, tmp_path):
    from lathe.llm.commands import run_train
    from lathe.llm.config.train import parse_train_config

    output = tmp_path / "out"
    values = {**BASE, "dataset_dir": str(folders / "data"), "model_name_or_path": str(folders / "model")}
    values.update(stage="sft", dataset="add", eval_dataset="add", do_train=False, do_eval=True, output_dir=str(output))
    run_train(parse_train_config(values))
    assert not (output / "README.md").exists()
