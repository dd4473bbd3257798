"""What real programs save besides the numbers, as transformers' Trainer saves it: the train metrics
train() returns (run_glue & co. write them to train_results.json), the total_flos of each checkpoint's
trainer_state.json. Each test runs transformers' Trainer on the same tiny model and data."""

from __future__ import annotations

import importlib
import json

import pytest

from tests.train.trainer_helpers import pad_collate, tiny_llama, token_items

pytestmark = pytest.mark.hf
transformers = pytest.importorskip("transformers")


def train(library: str, tmp_path, **overrides):
    module = importlib.import_module(library)
    options = dict(
        output_dir=str(tmp_path / library),
        report_to="none",
        per_device_train_batch_size=2,
        max_steps=6,
        logging_steps=4,
        save_steps=3,
        seed=0,
    )
    options.update(overrides)
    trainer = module.Trainer(
        model=tiny_llama(),
        args=module.TrainingArguments(**options),
        train_dataset=token_items(),
        data_collator=pad_collate,
    )
    return trainer, trainer.train()


@pytest.mark.parametrize("disable_tqdm", [True, False], ids=["printer", "progress bar"])
def test_train_metrics_keys_as_transformers(tmp_path, disable_tqdm):
    # transformers' PrinterCallback (disable_tqdm) pops total_flos from the logged dict, which is the
    # metrics dict train() returns; its progress bar leaves it there
    _, ours = train("lathe", tmp_path, disable_tqdm=disable_tqdm)
    _, theirs = train("transformers", tmp_path, disable_tqdm=disable_tqdm)
    assert sorted(ours.metrics) == sorted(theirs.metrics)
    assert ("total_flos" in ours.metrics) is (not disable_tqdm)


def test_checkpoint_total_flos_as_transformers(tmp_path):
    # logging at step 4 only: the checkpoint at step 3 (and at 6) counts every step up to it
    train("lathe", tmp_path, disable_tqdm=True)
    train("transformers", tmp_path, disable_tqdm=True)
    for step in (3, 6):
        ours, theirs = (
            json.loads((tmp_path / library / f"checkpoint-{step}" / "trainer_state.json").read_text())["total_flos"]
            for library in ("lathe", "transformers")
        )
        assert ours == theirs > 0


def test_model_card_is_transformers(tmp_path):
    # a text-classification model evaluated on a `datasets` Dataset with a metric the Hub knows as a tag:
    # the card's metadata (tags, datasets, metrics, model-index results) and text are transformers', but
    # for lathe's own framework-version line
    datasets = pytest.importorskip("datasets")
    import numpy as np

    def compute_metrics(prediction):
        return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}

    rows = [{"input_ids": [(3 * i + j) % 60 + 1 for j in range(8)], "labels": i % 2} for i in range(12)]
    data = datasets.Dataset.from_list(rows)
    cards = {}
    for library in ("lathe", "transformers"):
        module = importlib.import_module(library)
        torch_seeded = tiny_llama  # same weights for both
        model_config = torch_seeded().config
        model_config.num_labels = 2
        import torch

        torch.manual_seed(0)
        model = transformers.LlamaForSequenceClassification(model_config)
        args = module.TrainingArguments(
            output_dir=str(tmp_path / library / "run"),
            report_to="none",
            disable_tqdm=True,
            max_steps=4,
            eval_strategy="steps",
            eval_steps=2,
            per_device_train_batch_size=4,
            seed=0,
        )
        trainer = module.Trainer(
            model=model, args=args, train_dataset=data, eval_dataset=data, compute_metrics=compute_metrics
        )
        trainer.train()
        trainer.create_model_card(
            dataset_tags="glue", dataset_args="mrpc", dataset="GLUE MRPC", tasks="text-classification"
        )
        cards[library] = (tmp_path / library / "run" / "README.md").read_text()
    ours, theirs = cards["lathe"].splitlines(), cards["transformers"].splitlines()
    extra = [line for line in ours if line.startswith("- lathe ")]
    assert len(extra) == 1 and [line for line in ours if line not in extra] == theirs
    assert "metrics:\n- accuracy\n" in cards["lathe"]
