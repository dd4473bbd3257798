"""Regressions: label smoothing joins the num_items_in_batch normalisation (as in transformers 5);
an iterable dataset that yields nothing stops training instead of looping forever."""

import subprocess
import sys
import textwrap

import pytest

from tests.train.trainer_helpers import (
    assert_weights_close,
    make_trainer,
    pad_collate,
    tiny_llama,
    token_items,
    training_args,
)


def run_smoothed(tmp_path, library, batch_size, accumulation):
    trainer = make_trainer(
        library,
        model=tiny_llama(),
        args=training_args(
            tmp_path / f"{library}{batch_size}",
            library,
            max_steps=3,
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            label_smoothing_factor=0.1,
            max_grad_norm=0,
        ),
        train_dataset=token_items(12),
        data_collator=pad_collate,
    )
    trainer.train()
    return trainer


@pytest.mark.hf
def test_label_smoothing_on_a_causal_lm_matches_transformers(tmp_path):
    ours, theirs = run_smoothed(tmp_path, "lathe", 2, 2), run_smoothed(tmp_path, "transformers", 2, 2)
    assert [e.get("loss") for e in ours.state.log_history] == [e.get("loss") for e in theirs.state.log_history]
    assert_weights_close(ours.model, theirs.model, atol=0)


def test_label_smoothing_keeps_accumulation_equivalence(tmp_path):
    accumulated, single = run_smoothed(tmp_path, "lathe", 2, 2), run_smoothed(tmp_path, "lathe", 4, 1)
    assert_weights_close(accumulated.model, single.model, atol=1e-6)


def test_an_iterable_dataset_that_yields_nothing_stops_instead_of_looping_forever():
    code = textwrap.dedent("""
        from torch.utils.data import IterableDataset
        from tests.train.trainer_helpers import Regression, make_trainer, training_args
        class Empty(IterableDataset):
            def __iter__(self):
                return iter([])
        trainer = make_trainer(model=Regression(), args=training_args("/tmp/empty-stream", max_steps=3), train_dataset=Empty())
        try:
            trainer.train()
        except ValueError as error:
            print("raised:", error)
        print("global_step", trainer.state.global_step)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/work/main")
    assert "global_step 0" in result.stdout


def test_a_peft_model_keeps_its_base_models_columns(tmp_path):
    # The base model of a PEFT wrapper carries a peft_config too; unwrapping it a second time failed
    # ('LlamaModel' object has no attribute 'model') before any batch was built.
    from peft import LoraConfig, get_peft_model

    from lathe import Trainer

    model = get_peft_model(tiny_llama(), LoraConfig(task_type="CAUSAL_LM", r=2, target_modules=["q_proj"]))
    items = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3], "attention_mask": [1, 1, 1], "note": "x"}] * 2
    trainer = Trainer(model=model, args=training_args(tmp_path), train_dataset=items, data_collator=lambda rows: rows)
    assert sorted(next(iter(trainer.get_train_dataloader()))[0]) == ["attention_mask", "input_ids", "labels"]
