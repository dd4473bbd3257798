"""Evaluation regressions: iterable eval sets, predict() with batch_eval_metrics, and non-finite
batch losses under logging_nan_inf_filter — each compared with transformers where it applies."""

import pytest
import torch

from tests.train.trainer_helpers import Regression, make_trainer, regression_items, training_args


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def closed_form_mse(model, items):
    with torch.no_grad():
        x = torch.stack([item["x"] for item in items])
        y = torch.stack([item["labels"] for item in items])
        return ((model.linear(x).squeeze(-1) - y) ** 2).mean().item()


def test_evaluate_an_iterable_dataset(tmp_path):
    items = regression_items(10)
    trainer = make_trainer(model=Regression(), args=training_args(tmp_path, per_device_eval_batch_size=4))
    metrics = trainer.evaluate(Stream(items))
    assert metrics["eval_loss"] == pytest.approx(closed_form_mse(trainer.model, items), rel=1e-6)


def test_batch_eval_metrics_on_an_iterable_dataset_marks_only_the_last_batch(tmp_path):
    calls = []

    def metrics(prediction, compute_result):
        calls.append((compute_result, len(prediction.predictions)))
        return {"batches": float(len(calls))}

    args = training_args(tmp_path, per_device_eval_batch_size=4, batch_eval_metrics=True)
    trainer = make_trainer(model=Regression(), args=args, compute_metrics=metrics)
    trainer.evaluate(Stream(regression_items(10)))
    assert calls == [(False, 4), (False, 4), (True, 2)]


@pytest.mark.parametrize("library", ["lathe", pytest.param("transformers", marks=pytest.mark.hf)])
def test_predict_keeps_predictions_with_batch_eval_metrics(tmp_path, library):
    args = training_args(tmp_path, library, per_device_eval_batch_size=4, batch_eval_metrics=True)
    trainer = make_trainer(library, model=Regression(), args=args, compute_metrics=lambda p, compute_result: {})
    output = trainer.predict(regression_items(10))
    assert output.predictions.shape == (10,)


class NanOnSecondBatch(Regression):
    def forward(self, x, labels=None):
        output = super().forward(x, labels)
        if labels is not None and self.forward_calls == 2:
            output["loss"] = output["loss"] * float("nan")
        return output


@pytest.mark.parametrize("library", ["lathe", pytest.param("transformers", marks=pytest.mark.hf)])
def test_eval_loss_leaves_out_non_finite_batches(tmp_path, library):
    items = regression_items(10)
    trainer = make_trainer(
        library, model=NanOnSecondBatch(), args=training_args(tmp_path, library, per_device_eval_batch_size=4)
    )
    loss = trainer.evaluate(items)["eval_loss"]
    finite_items = items[:4] + items[8:]  # the second batch (items 4..7) had a nan loss
    assert loss == pytest.approx(closed_form_mse(trainer.model, finite_items), rel=1e-6)


def test_eval_loss_is_nan_without_the_filter(tmp_path):
    args = training_args(tmp_path, per_device_eval_batch_size=4, logging_nan_inf_filter=False)
    trainer = make_trainer(model=NanOnSecondBatch(), args=args)
    assert torch.isnan(torch.tensor(trainer.evaluate(regression_items(10))["eval_loss"]))


def test_gathered_batches_merge_into_log_n_chunks_with_the_same_padded_result():
    """Kept predictions merge pairwise as they come (a flat heap on long evaluations): 37 batches of
    varying length end as 3 chunks (37 = 32 + 4 + 1), and the result is the one-shot padded concat."""
    import numpy as np

    from lathe.train.evaluation.loop import Gathered, pad_and_concatenate

    generator = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(0, 50, (3, int(torch.randint(2, 9, (1,), generator=generator))), generator=generator)
        for _ in range(37)
    ]
    gathered = Gathered(transfer_every=1)
    for batch in batches:
        gathered.add(batch)
    assert len(gathered.on_cpu) == 3
    expected = pad_and_concatenate([b.numpy() for b in batches])
    np.testing.assert_array_equal(gathered.result(), expected)
    assert expected.shape == (111, max(b.shape[1] for b in batches))

    unmerged = Gathered(transfer_every=1, concatenate=False)  # eval_do_concat_batches=False: a list per batch
    for batch in batches:
        unmerged.add(batch)
    assert len(unmerged.result()) == 37
