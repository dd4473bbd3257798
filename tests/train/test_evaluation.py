"""Tests for evaluate() / predict() / prediction_step (lathe.train.evaluation.predicting), the evaluation loop
(lathe.train.evaluation.loop), EarlyStoppingCallback (lathe.train.callbacks.flow) and the best model and checkpoint
rotation (lathe.train.resume). Expected numbers are worked out by hand from tiny models; tests marked
`hf` run the same job through transformers.Trainer and compare."""

from __future__ import annotations

import copy
import importlib
import json
import os
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from lathe.train import EarlyStoppingCallback, EvalPrediction, PredictionOutput, Trainer

# ----- tiny models and data -----


class Regressor(nn.Module):
    """logits = x·w (+ b), mean-squared-error loss: a transformers-style dict output."""

    main_input_name = "x"

    def __init__(self, features: int = 3, bias: bool = True):
        super().__init__()
        self.linear = nn.Linear(features, 1, bias=bias)

    def forward(self, x, labels=None):
        logits = self.linear(x).squeeze(-1)
        if labels is None:
            return {"logits": logits}
        return {"loss": F.mse_loss(logits, labels), "logits": logits}


class Tagger(nn.Module):
    """One prediction per token: logits[b, t] = scale * input_ids[b, t] + 0.5 (scale starts at 2),
    so predictions are known exactly and their length follows the batch's sequence length."""

    def __init__(self, vocab: int = 0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))
        self.vocab = vocab

    def forward(self, input_ids, labels=None):
        logits = self.scale * input_ids.float() + 0.5
        if self.vocab:  # per-token scores over `vocab` classes, highest at input_ids % vocab
            classes = torch.arange(self.vocab, dtype=torch.float32)
            logits = -((classes - (input_ids % self.vocab).unsqueeze(-1).float()) ** 2) * self.scale
        if labels is None:
            return {"logits": logits}
        if self.vocab:
            loss = F.cross_entropy(logits.flatten(0, 1), (labels % self.vocab).flatten())
        else:
            loss = F.mse_loss(logits, labels.float())
        return {"loss": loss, "logits": logits}


def regression_data(n: int = 10, features: int = 3, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = torch.randn(n, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(n)], x, y


def regressor(seed: int = 0, **kwargs) -> Regressor:
    torch.manual_seed(seed)
    return Regressor(**kwargs)


# Sequences of lengths 2, 2, 4, 4, 3: with batches of 2 the batches are 2, 4 and 3 tokens long.
SEQUENCES = [[1, 2], [3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15]]
SEQUENCE_DATA = [{"input_ids": torch.tensor(s), "labels": torch.tensor(s)} for s in SEQUENCES]


def stack_collator(items):
    """Stacks each key; the items of one batch share a length by construction (no padding here, so
    any -100 in the results comes from the evaluation loop)."""
    return {key: torch.stack([item[key] for item in items]) for key in items[0]}


def padded(rows, dtype, width: int = 4):
    out = np.full((len(rows), width), -100, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def library(name: str):
    return importlib.import_module("lathe.train" if name == "lathe" else "transformers")


def make_trainer(tmp_path, model, lib: str = "lathe", trainer_class=None, args=None, **trainer_kwargs):
    """A Trainer from `lib` ("lathe" or "hf") with quiet, CPU-only arguments: no checkpoints
    unless asked for, eval batches of 4, train batches of 2."""
    module = library(lib)
    options = dict(
        output_dir=str(tmp_path / lib),
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=4,
        save_strategy="no",
    )
    options.update(args or {})
    cls = trainer_class or module.Trainer
    return cls(model=model, args=module.TrainingArguments(**options), **trainer_kwargs)


def capture_eval_predictions(store: list, metrics: dict | None = None):
    def compute_metrics(eval_pred):
        store.append(eval_pred)
        return dict(metrics or {"count": len(eval_pred.label_ids)})

    return compute_metrics


def without_speed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.endswith(("_runtime", "_per_second"))}


# ----- 1. metric names -----


def test_evaluate_returns_eval_prefixed_loss_and_speed_metrics(tmp_path):
    data, _, _ = regression_data()
    trainer = make_trainer(
        tmp_path, regressor(), eval_dataset=data, compute_metrics=lambda p: {"count": len(p.predictions)}
    )
    metrics = trainer.evaluate()
    assert {"eval_loss", "eval_count", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second"} <= set(
        metrics
    )
    # Every metric is prefixed, but for the epoch that trainer.log adds (0 before training, as transformers 5).
    assert all(key.startswith("eval_") for key in metrics if key != "epoch"), metrics
    assert metrics["epoch"] == 0
    assert metrics["eval_count"] == 10
    # 10 samples in ceil(10 / 4) = 3 batches, both rates measured over the same runtime.
    rates = metrics["eval_samples_per_second"] / metrics["eval_steps_per_second"]
    assert rates == pytest.approx(10 / 3, rel=1e-3)
    assert metrics["eval_runtime"] > 0
    # evaluate() logs its metrics and tells the callbacks.
    assert trainer.state.log_history[-1]["eval_loss"] == metrics["eval_loss"]


def test_metric_key_prefix_renames_every_metric(tmp_path):
    data, _, _ = regression_data()
    trainer = make_trainer(
        tmp_path, regressor(), eval_dataset=data, compute_metrics=lambda p: {"count": 10, "dev_ready": 1}
    )
    metrics = trainer.evaluate(metric_key_prefix="dev")
    assert set(metrics) == {
        "dev_loss",
        "dev_count",
        "dev_ready",
        "dev_runtime",
        "dev_samples_per_second",
        "dev_steps_per_second",
        "epoch",  # added by trainer.log, as in transformers
    }
    assert metrics["dev_loss"] == trainer.evaluate()["eval_loss"]


def test_dict_of_eval_datasets_gives_one_prefix_per_dataset(tmp_path):
    data_a, _, _ = regression_data(6, seed=1)
    data_b, _, _ = regression_data(9, seed=2)
    trainer = make_trainer(tmp_path, regressor(), eval_dataset={"a": data_a, "b": data_b})
    metrics = trainer.evaluate()
    for name, data in (("a", data_a), ("b", data_b)):
        assert {
            f"eval_{name}_loss",
            f"eval_{name}_runtime",
            f"eval_{name}_samples_per_second",
            f"eval_{name}_steps_per_second",
        } <= set(metrics)
        assert metrics[f"eval_{name}_loss"] == trainer.evaluate(data)["eval_loss"]
    assert abs(metrics["eval_a_loss"] - metrics["eval_b_loss"]) > 0.1
    assert "eval_loss" not in metrics


def _train_with_two_eval_sets(tmp_path, lib: str):
    train, _, _ = regression_data(8, seed=3)
    data_a, _, _ = regression_data(6, seed=1)
    data_b, _, _ = regression_data(9, seed=2)
    trainer = make_trainer(
        tmp_path,
        regressor(),
        lib,
        train_dataset=train,
        eval_dataset={"a": data_a, "b": data_b},
        args=dict(max_steps=4, eval_strategy="steps", eval_steps=2, learning_rate=0.1),
    )
    trainer.train()
    return trainer, {
        (log["step"], k): v
        for log in trainer.state.log_history
        for k, v in log.items()
        if k in ("eval_a_loss", "eval_b_loss")
    }


def test_dict_of_eval_datasets_during_training(tmp_path):
    trainer, evals = _train_with_two_eval_sets(tmp_path, "lathe")
    assert set(evals) == {(2, "eval_a_loss"), (2, "eval_b_loss"), (4, "eval_a_loss"), (4, "eval_b_loss")}
    final = trainer.evaluate()
    assert evals[4, "eval_a_loss"] == pytest.approx(final["eval_a_loss"], abs=1e-7)
    assert evals[4, "eval_b_loss"] == pytest.approx(final["eval_b_loss"], abs=1e-7)
    assert evals[2, "eval_a_loss"] != evals[4, "eval_a_loss"]  # it trained in between


@pytest.mark.hf
def test_dict_of_eval_datasets_during_training_matches_transformers(tmp_path):
    _, ours = _train_with_two_eval_sets(tmp_path, "lathe")
    _, theirs = _train_with_two_eval_sets(tmp_path, "hf")
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert ours[key] == pytest.approx(theirs[key], abs=1e-6), key


# ----- 2. eval_loss over a partial last batch -----


def test_eval_loss_counts_a_partial_last_batch_once(tmp_path):
    data, x, y = regression_data(10)
    model = regressor()
    with torch.no_grad():
        squared_errors = (model(x)["logits"] - y) ** 2
    exact = squared_errors.double().mean().item()
    # Batches of 4, 4, 2: averaging the three batch means would weigh the last two samples double.
    mean_of_batch_means = (
        torch.stack([squared_errors[:4].mean(), squared_errors[4:8].mean(), squared_errors[8:].mean()]).mean().item()
    )
    assert abs(exact - mean_of_batch_means) > 1e-3  # the data can tell the two apart
    metrics = make_trainer(tmp_path, model, eval_dataset=data).evaluate()
    assert metrics["eval_loss"] == pytest.approx(exact, abs=1e-6)


@pytest.mark.hf
def test_eval_loss_with_partial_batch_matches_transformers(tmp_path):
    data, _, _ = regression_data(10)
    model = regressor()
    ours = make_trainer(tmp_path, copy.deepcopy(model), eval_dataset=data).evaluate()
    theirs = make_trainer(tmp_path, copy.deepcopy(model), "hf", eval_dataset=data).evaluate()
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], abs=1e-6)


# ----- 3. EvalPrediction: numpy, concatenated, padded with -100 -----

EXPECTED_LABELS = padded(SEQUENCES, np.int64)
EXPECTED_PREDICTIONS = padded([[2 * t + 0.5 for t in s] for s in SEQUENCES], np.float32)


def _sequence_eval(tmp_path, lib: str = "lathe", **trainer_kwargs):
    seen = []
    trainer = make_trainer(
        tmp_path,
        Tagger(),
        lib,
        eval_dataset=SEQUENCE_DATA,
        data_collator=stack_collator,
        compute_metrics=capture_eval_predictions(seen),
        args=dict(per_device_eval_batch_size=2),
        **trainer_kwargs,
    )
    metrics = trainer.evaluate()
    assert len(seen) == 1
    return seen[0], metrics


def test_eval_prediction_is_numpy_padded_with_minus_100_across_batches(tmp_path):
    eval_pred, metrics = _sequence_eval(tmp_path)
    assert isinstance(eval_pred, EvalPrediction)
    assert isinstance(eval_pred.predictions, np.ndarray) and isinstance(eval_pred.label_ids, np.ndarray)
    np.testing.assert_array_equal(eval_pred.label_ids, EXPECTED_LABELS)
    np.testing.assert_array_equal(eval_pred.predictions, EXPECTED_PREDICTIONS)
    assert eval_pred.label_ids.dtype == np.int64 and eval_pred.predictions.dtype == np.float32
    predictions, labels = eval_pred  # unpacks like a tuple, as in transformers
    assert predictions is eval_pred.predictions and labels is eval_pred.label_ids
    assert eval_pred.inputs is None and eval_pred.losses is None and len(eval_pred) == 2
    assert metrics["eval_count"] == 5


@pytest.mark.hf
def test_eval_prediction_arrays_match_transformers(tmp_path):
    ours, our_metrics = _sequence_eval(tmp_path)
    theirs, their_metrics = _sequence_eval(tmp_path, "hf")
    for mine, other in ((ours.predictions, theirs.predictions), (ours.label_ids, theirs.label_ids)):
        assert mine.dtype == other.dtype
        np.testing.assert_array_equal(mine, other)
    assert our_metrics["eval_loss"] == pytest.approx(their_metrics["eval_loss"], rel=1e-6)


# ----- 4. preprocess_logits_for_metrics, batch_eval_metrics, include_for_metrics, ... -----


def test_preprocess_logits_for_metrics_runs_once_per_batch(tmp_path):
    calls = []

    def argmax(logits, labels):
        calls.append((tuple(logits.shape), tuple(labels.shape)))
        return logits.argmax(dim=-1)

    seen = []
    trainer = make_trainer(
        tmp_path,
        Tagger(vocab=3),
        eval_dataset=SEQUENCE_DATA,
        data_collator=stack_collator,
        compute_metrics=capture_eval_predictions(seen),
        preprocess_logits_for_metrics=argmax,
        args=dict(per_device_eval_batch_size=2),
    )
    trainer.evaluate()
    assert calls == [((2, 2, 3), (2, 2)), ((2, 4, 3), (2, 4)), ((1, 3, 3), (1, 3))]
    # Only the argmax (token % 3) is gathered, padded like any prediction.
    np.testing.assert_array_equal(seen[0].predictions, padded([[t % 3 for t in s] for s in SEQUENCES], np.int64))


@pytest.mark.hf
def test_preprocess_logits_for_metrics_matches_transformers(tmp_path):
    results = []
    for lib in ("lathe", "hf"):
        seen = []
        make_trainer(
            tmp_path,
            Tagger(vocab=3),
            lib,
            eval_dataset=SEQUENCE_DATA,
            data_collator=stack_collator,
            compute_metrics=capture_eval_predictions(seen),
            preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1),
            args=dict(per_device_eval_batch_size=2),
        ).evaluate()
        results.append(seen[0])
    np.testing.assert_array_equal(results[0].predictions, results[1].predictions)
    np.testing.assert_array_equal(results[0].label_ids, results[1].label_ids)


def test_eval_do_concat_batches_false_keeps_one_array_per_batch(tmp_path):
    seen = []
    make_trainer(
        tmp_path,
        Tagger(),
        eval_dataset=SEQUENCE_DATA,
        data_collator=stack_collator,
        compute_metrics=capture_eval_predictions(seen),
        args=dict(per_device_eval_batch_size=2, eval_do_concat_batches=False),
    ).evaluate()
    predictions, labels = seen[0]
    assert [p.shape for p in predictions] == [(2, 2), (2, 4), (1, 3)]
    for batch, start in zip(labels, (0, 2, 4)):
        np.testing.assert_array_equal(batch, np.array(SEQUENCES[start : start + len(batch)]))


def _batch_eval_calls(tmp_path, lib: str):
    data, _, _ = regression_data(10)
    calls = []

    def compute_metrics(eval_pred, compute_result):
        calls.append((compute_result, len(eval_pred.label_ids)))
        return {"calls": len(calls)}

    metrics = make_trainer(
        tmp_path,
        regressor(),
        lib,
        eval_dataset=data,
        compute_metrics=compute_metrics,
        args=dict(batch_eval_metrics=True),
    ).evaluate()
    return calls, metrics


def test_batch_eval_metrics_calls_compute_metrics_per_batch(tmp_path):
    data, x, y = regression_data(10)
    model = regressor()
    calls = []
    totals = {"squared_error": 0.0, "count": 0}

    def streaming_mse(eval_pred, compute_result):
        calls.append((compute_result, len(eval_pred.label_ids)))
        predictions, labels = eval_pred.predictions, eval_pred.label_ids
        totals["squared_error"] += float(((predictions - labels) ** 2).sum())
        totals["count"] += len(labels)
        if compute_result:
            return {"mse": totals["squared_error"] / totals["count"], "count": totals["count"]}
        return {}

    trainer = make_trainer(
        tmp_path, model, eval_dataset=data, compute_metrics=streaming_mse, args=dict(batch_eval_metrics=True)
    )
    metrics = trainer.evaluate()
    assert calls == [(False, 4), (False, 4), (True, 2)]
    with torch.no_grad():
        exact = ((model(x)["logits"] - y) ** 2).double().mean().item()
    assert metrics["eval_mse"] == pytest.approx(exact, abs=1e-6)
    assert metrics["eval_loss"] == pytest.approx(exact, abs=1e-6)
    assert metrics["eval_count"] == 10


@pytest.mark.hf
def test_batch_eval_metrics_calls_match_transformers(tmp_path):
    ours, our_metrics = _batch_eval_calls(tmp_path, "lathe")
    theirs, their_metrics = _batch_eval_calls(tmp_path, "hf")
    assert ours == theirs == [(False, 4), (False, 4), (True, 2)]
    assert our_metrics["eval_calls"] == their_metrics["eval_calls"] == 3
    assert our_metrics["eval_loss"] == pytest.approx(their_metrics["eval_loss"], abs=1e-6)


def _include_inputs_and_losses(tmp_path, lib: str):
    data, _, _ = regression_data(10)
    seen = []
    trainer = make_trainer(
        tmp_path,
        regressor(),
        lib,
        eval_dataset=data,
        compute_metrics=capture_eval_predictions(seen),
        args=dict(include_for_metrics=["inputs", "loss"]),
    )
    trainer.evaluate()
    return seen[0]


def test_include_for_metrics_passes_inputs_and_per_sample_losses(tmp_path):
    _, x, y = regression_data(10)
    eval_pred = _include_inputs_and_losses(tmp_path, "lathe")
    np.testing.assert_array_equal(eval_pred.inputs, x.numpy())
    with torch.no_grad():
        squared_errors = (regressor()(x)["logits"] - y) ** 2
    batch_means = [squared_errors[:4].mean(), squared_errors[4:8].mean(), squared_errors[8:].mean()]
    expected = np.array([batch_means[0]] * 4 + [batch_means[1]] * 4 + [batch_means[2]] * 2, dtype=np.float32)
    np.testing.assert_allclose(eval_pred.losses, expected, rtol=1e-6)
    assert len(eval_pred) == 4  # (predictions, label_ids, inputs, losses)


@pytest.mark.hf
def test_include_for_metrics_matches_transformers(tmp_path):
    ours = _include_inputs_and_losses(tmp_path, "lathe")
    theirs = _include_inputs_and_losses(tmp_path, "hf")
    np.testing.assert_array_equal(ours.inputs, theirs.inputs)
    np.testing.assert_allclose(ours.losses, theirs.losses, rtol=1e-6)
    np.testing.assert_array_equal(ours.predictions, theirs.predictions)


def test_eval_accumulation_steps_changes_nothing(tmp_path):
    results = []
    for steps in (None, 2, 1):
        seen = []
        trainer = make_trainer(
            tmp_path,
            Tagger(),
            eval_dataset=SEQUENCE_DATA,
            data_collator=stack_collator,
            compute_metrics=capture_eval_predictions(seen),
            args=dict(per_device_eval_batch_size=2, eval_accumulation_steps=steps),
        )
        results.append((without_speed(trainer.evaluate()), seen[0]))
    for metrics, eval_pred in results:
        assert metrics == results[0][0]
        np.testing.assert_array_equal(eval_pred.predictions, EXPECTED_PREDICTIONS)
        np.testing.assert_array_equal(eval_pred.label_ids, EXPECTED_LABELS)


def test_prediction_loss_only_returns_no_predictions(tmp_path):
    data, x, y = regression_data(10)
    seen = []
    trainer = make_trainer(
        tmp_path, regressor(), compute_metrics=capture_eval_predictions(seen), args=dict(prediction_loss_only=True)
    )
    output = trainer.predict(data)
    assert output.predictions is None and output.label_ids is None
    assert seen == []  # nothing to compute metrics on
    with torch.no_grad():
        exact = ((regressor()(x)["logits"] - y) ** 2).double().mean().item()
    assert output.metrics["test_loss"] == pytest.approx(exact, abs=1e-6)


def test_predict_returns_predictions_labels_and_test_metrics(tmp_path):
    data, x, y = regression_data(10)
    model = regressor()
    with torch.no_grad():
        expected = model(x)["logits"].numpy()
    trainer = make_trainer(tmp_path, model, compute_metrics=lambda p: {"count": len(p.predictions)})
    output = trainer.predict(data)
    assert isinstance(output, PredictionOutput)
    np.testing.assert_allclose(output.predictions, expected, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(output.label_ids, y.numpy())
    assert {"test_loss", "test_count", "test_runtime", "test_samples_per_second", "test_steps_per_second"} <= set(
        output.metrics
    )
    assert all(key.startswith("test_") for key in output.metrics)
    assert output.metrics["test_loss"] == pytest.approx(float(((expected - y.numpy()) ** 2).mean()), abs=1e-6)
    # predict() does not write to log_history (transformers logs only evaluate()).
    assert trainer.state.log_history == []


def test_predict_without_labels_gives_predictions_only(tmp_path):
    data, x, _ = regression_data(10)
    model = regressor()
    output = make_trainer(tmp_path, model).predict([{"x": item["x"]} for item in data])
    with torch.no_grad():
        np.testing.assert_allclose(output.predictions, model(x)["logits"].numpy(), atol=1e-6)
    assert output.label_ids is None
    assert "test_loss" not in output.metrics


class ManyOutputs(Regressor):
    """Returns extra keys besides loss and logits, like a model that also gives hidden states."""

    def forward(self, x, labels=None):
        outputs = super().forward(x, labels)
        return {**outputs, "hidden": x * 2, "aux": x.sum(-1)}


def _predictions(tmp_path, model, lib="lathe", **predict_kwargs):
    data, _, _ = regression_data(10)
    return make_trainer(tmp_path, model, lib).predict(data, **predict_kwargs).predictions


def test_extra_output_keys_become_a_tuple_of_predictions_and_ignore_keys_drops_them(tmp_path):
    _, x, _ = regression_data(10)
    model = ManyOutputs(features=3)
    with torch.no_grad():
        logits = model.linear(x).squeeze(-1).numpy()
    everything = _predictions(tmp_path, model)
    assert isinstance(everything, tuple) and len(everything) == 3  # logits, hidden, aux: output order
    np.testing.assert_allclose(everything[0], logits, atol=1e-6)
    np.testing.assert_array_equal(everything[1], (x * 2).numpy())
    np.testing.assert_array_equal(everything[2], x.sum(-1).numpy())
    logits_and_aux = _predictions(tmp_path, model, ignore_keys=["hidden"])
    assert len(logits_and_aux) == 2
    np.testing.assert_array_equal(logits_and_aux[1], x.sum(-1).numpy())
    only_logits = _predictions(tmp_path, model, ignore_keys=["hidden", "aux"])
    assert isinstance(only_logits, np.ndarray)  # one left: no tuple
    np.testing.assert_allclose(only_logits, logits, atol=1e-6)


def test_config_keys_to_ignore_at_inference_is_the_default_ignore_list(tmp_path):
    _, x, _ = regression_data(10)
    model = ManyOutputs(features=3)
    model.config = SimpleNamespace(keys_to_ignore_at_inference=["hidden"])
    predictions = _predictions(tmp_path, model)
    assert len(predictions) == 2
    np.testing.assert_array_equal(predictions[1], x.sum(-1).numpy())
    # An explicit ignore_keys replaces the config's list.
    predictions = _predictions(tmp_path, model, ignore_keys=["aux"])
    assert len(predictions) == 2
    np.testing.assert_array_equal(predictions[1], (x * 2).numpy())
    # evaluate() passes ignore_keys on too.
    seen = []
    data, _, _ = regression_data(10)
    make_trainer(tmp_path, model, eval_dataset=data, compute_metrics=capture_eval_predictions(seen)).evaluate(
        ignore_keys=["hidden", "aux"]
    )
    assert isinstance(seen[0].predictions, np.ndarray) and seen[0].predictions.shape == (10,)


@pytest.mark.hf
def test_extra_output_keys_match_transformers(tmp_path):
    model = ManyOutputs(features=3)
    for ignore_keys in (None, ["hidden"]):
        ours = _predictions(tmp_path, copy.deepcopy(model), ignore_keys=ignore_keys)
        theirs = _predictions(tmp_path, copy.deepcopy(model), "hf", ignore_keys=ignore_keys)
        assert len(ours) == len(theirs)
        for mine, other in zip(ours, theirs):
            np.testing.assert_allclose(mine, other, atol=1e-6)


# ----- 5. memory: what the loop keeps -----


class KeepsLoopOutput(Trainer):
    """Records what evaluation_loop returned and how prediction_step was asked to run."""

    def evaluation_loop(self, *args, **kwargs):
        self.loop_output = super().evaluation_loop(*args, **kwargs)
        return self.loop_output

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        self.loss_only_flags = getattr(self, "loss_only_flags", []) + [prediction_loss_only]
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)


def test_evaluate_without_compute_metrics_keeps_no_predictions(tmp_path):
    data, _, _ = regression_data(10)
    trainer = make_trainer(tmp_path, regressor(), trainer_class=KeepsLoopOutput, eval_dataset=data)
    metrics = trainer.evaluate()
    assert trainer.loop_output.predictions is None and trainer.loop_output.label_ids is None
    assert trainer.loss_only_flags == [True, True, True]
    assert "eval_loss" in metrics


def test_batch_eval_metrics_keeps_no_predictions(tmp_path):
    data, _, _ = regression_data(10)
    trainer = make_trainer(
        tmp_path,
        regressor(),
        trainer_class=KeepsLoopOutput,
        eval_dataset=data,
        compute_metrics=lambda p, compute_result: {"done": float(compute_result)},
        args=dict(batch_eval_metrics=True),
    )
    assert trainer.evaluate()["eval_done"] == 1.0
    assert trainer.loop_output.predictions is None and trainer.loop_output.label_ids is None
    assert trainer.loss_only_flags == [False, False, False]  # predictions were made, then dropped


class WideOutputs(nn.Module):
    """16 KiB of logits per sample, so what the evaluation loop keeps shows up in traced memory."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4096))

    def forward(self, x, labels=None):
        logits = x[:, :1] * self.weight
        return {"loss": ((logits[:, 0] - labels) ** 2).mean(), "logits": logits}


def _peak_traced_bytes(tmp_path, num_samples: int, batch_eval_metrics: bool) -> int:
    data = [{"x": torch.full((1,), float(i)), "labels": torch.tensor(0.0)} for i in range(num_samples)]

    def compute_metrics(eval_pred, compute_result=False):
        return {"mean": float(np.asarray(eval_pred.predictions).mean())}

    trainer = make_trainer(
        tmp_path,
        WideOutputs(),
        eval_dataset=data,
        compute_metrics=compute_metrics,
        args=dict(batch_eval_metrics=batch_eval_metrics, per_device_eval_batch_size=8),
    )
    trainer.evaluate()  # warm-up: first-call allocations are not the loop's
    tracemalloc.start()
    try:
        trainer.evaluate()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_batch_eval_metrics_memory_does_not_grow_with_the_eval_set(tmp_path):
    small, large = 32, 320  # 0.5 MiB and 5 MiB of logits
    kept_small = _peak_traced_bytes(tmp_path, small, batch_eval_metrics=False)
    kept_large = _peak_traced_bytes(tmp_path, large, batch_eval_metrics=False)
    # Control: gathering everything does grow with the data, so the measurement can see it.
    assert kept_large > 5 * kept_small
    assert kept_large > large * 4096 * 4
    streamed_small = _peak_traced_bytes(tmp_path, small, batch_eval_metrics=True)
    streamed_large = _peak_traced_bytes(tmp_path, large, batch_eval_metrics=True)
    assert streamed_large < 3 * streamed_small + (1 << 20)
    assert streamed_large < kept_large / 4


# ----- 6. EarlyStoppingCallback -----


def scripted_metric(name: str, values: list[float]):
    """compute_metrics returning the next of `values` at each evaluation."""
    remaining = iter(values)

    def compute_metrics(eval_pred):
        return {name: next(remaining)}

    return compute_metrics


# SGD (lr 0.1, no clipping) on loss (w - 2)^2 from w = 0: w_t = 2 - 2 * 0.8^t, so on an eval set
# whose target is 1 the eval loss (w_t - 1)^2 is 0.36, 0.0784, 0.000576, 0.0327, 0.1187: best at step 3.
ONES_TRAIN = [{"x": torch.ones(1), "labels": torch.tensor(2.0)} for _ in range(6)]
ONES_EVAL = [{"x": torch.ones(1), "labels": torch.tensor(1.0)} for _ in range(2)]


def weight_after(step: int) -> float:
    return 2 - 2 * 0.8**step


def scalar_model() -> Regressor:
    model = Regressor(features=1, bias=False)
    nn.init.zeros_(model.linear.weight)
    return model


def scalar_job(tmp_path, lib: str = "lathe", max_steps: int = 5, callbacks=None, compute_metrics=None, **args):
    options = dict(
        max_steps=max_steps,
        per_device_train_batch_size=1,
        learning_rate=0.1,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        eval_strategy="steps",
        eval_steps=1,
    )
    options.update(args)
    return make_trainer(
        tmp_path,
        scalar_model(),
        lib,
        train_dataset=ONES_TRAIN,
        eval_dataset=ONES_EVAL,
        compute_metrics=compute_metrics,
        callbacks=callbacks,
        args=options,
    )


def trained_weight(trainer) -> float:
    return trainer.model.linear.weight.item()


def test_scalar_job_follows_the_closed_form(tmp_path):
    """The job the best-model tests rely on: weights and eval losses as computed above."""
    trainer = scalar_job(tmp_path, max_steps=3)
    trainer.train()
    assert trained_weight(trainer) == pytest.approx(weight_after(3), abs=1e-6)
    eval_losses = [log["eval_loss"] for log in trainer.state.log_history if "eval_loss" in log]
    assert eval_losses == pytest.approx([(weight_after(t) - 1) ** 2 for t in (1, 2, 3)], abs=1e-6)


# (metric, values per evaluation, greater_is_better, patience, threshold, step where training stops,
#  patience counter then): a "better" value within the threshold does not count as an improvement.
EARLY_STOPPING_CASES = [
    ("score", [1.0, 0.9, 0.85, 0.849, 0.84] + [0.1] * 5, False, 2, 0.02, 5, 2),
    ("accuracy", [0.5, 0.6, 0.61, 0.7] + [0.9] * 6, True, 1, 0.05, 3, 1),
    ("accuracy", [0.5, 0.4, 0.6, 0.5, 0.55, 0.59] + [0.9] * 4, True, 3, 0.0, 6, 3),
]


def _early_stopping_run(tmp_path, lib, metric, values, greater, patience, threshold, **args):
    callback = library(lib).EarlyStoppingCallback(early_stopping_patience=patience, early_stopping_threshold=threshold)
    trainer = scalar_job(
        tmp_path,
        lib,
        max_steps=10,
        callbacks=[callback],
        compute_metrics=scripted_metric(metric, values),
        metric_for_best_model=metric,
        greater_is_better=greater,
        **args,
    )
    trainer.train()
    return trainer, callback


@pytest.mark.parametrize("metric, values, greater, patience, threshold, stop_step, counter", EARLY_STOPPING_CASES)
def test_early_stopping_stops_at_the_right_step(
    tmp_path, metric, values, greater, patience, threshold, stop_step, counter
):
    trainer, callback = _early_stopping_run(tmp_path, "lathe", metric, values, greater, patience, threshold)
    assert trainer.state.global_step == stop_step
    assert callback.early_stopping_patience_counter == counter
    assert trained_weight(trainer) == pytest.approx(weight_after(stop_step), abs=1e-6)
    seen = values[:stop_step]
    assert trainer.state.best_metric == (max(seen) if greater else min(seen))


@pytest.mark.hf
@pytest.mark.parametrize("metric, values, greater, patience, threshold, stop_step, counter", EARLY_STOPPING_CASES)
def test_early_stopping_matches_transformers(
    tmp_path, metric, values, greater, patience, threshold, stop_step, counter
):
    ours, our_callback = _early_stopping_run(tmp_path, "lathe", metric, values, greater, patience, threshold)
    theirs, their_callback = _early_stopping_run(tmp_path, "hf", metric, values, greater, patience, threshold)
    assert ours.state.global_step == theirs.state.global_step == stop_step
    assert our_callback.state() == their_callback.state()


def test_early_stopping_state_is_exported_with_each_checkpoint(tmp_path):
    metric, values, greater, patience, threshold, stop_step, counter = EARLY_STOPPING_CASES[0]
    trainer, callback = _early_stopping_run(
        tmp_path,
        "lathe",
        metric,
        values,
        greater,
        patience,
        threshold,
        save_strategy="steps",
        save_steps=1,
    )
    assert callback.state() == {
        "args": {"early_stopping_patience": 2, "early_stopping_threshold": 0.02},
        "attributes": {"early_stopping_patience_counter": 2},
    }
    # The counter each checkpoint recorded: reset by the improvements at steps 1-3, then 1 and 2.
    counters = []
    for step in range(1, stop_step + 1):
        with open(tmp_path / "lathe" / f"checkpoint-{step}" / "trainer_state.json", encoding="utf-8") as f:
            saved = json.load(f)["stateful_callbacks"]["EarlyStoppingCallback"]
        counters.append(saved["attributes"]["early_stopping_patience_counter"])
    assert counters == [0, 0, 0, 1, 2]
    restored = EarlyStoppingCallback.from_state(callback.state())
    assert (
        restored.early_stopping_patience,
        restored.early_stopping_threshold,
        restored.early_stopping_patience_counter,
    ) == (2, 0.02, 2)


def test_early_stopping_needs_a_metric_and_evaluation(tmp_path):
    trainer = scalar_job(tmp_path, callbacks=[EarlyStoppingCallback()])
    with pytest.raises(ValueError, match="metric_for_best_model"):
        trainer.train()


# ----- 7. best model, rotation, save_strategy="best" -----


def checkpoint_steps(folder) -> list[int]:
    if not os.path.isdir(folder):
        return []
    return sorted(int(name.split("-")[1]) for name in os.listdir(folder) if name.startswith("checkpoint-"))


def checkpoint_lister(lib: str, folder):
    """A callback that lists the checkpoint folders after each save (after rotation)."""

    class ListCheckpoints(library(lib).TrainerCallback):
        def __init__(self):
            self.listings = []

        def on_save(self, args, state, control, **kwargs):
            self.listings.append(checkpoint_steps(folder))

    return ListCheckpoints()


def saved_weight(folder, step: int) -> torch.Tensor:
    return load_file(os.path.join(folder, f"checkpoint-{step}", "model.safetensors"))["linear.weight"]


def test_load_best_model_at_end_by_loss(tmp_path):
    trainer = scalar_job(tmp_path, save_strategy="steps", save_steps=1, load_best_model_at_end=True)
    trainer.train()
    state = trainer.state
    assert state.best_global_step == 3
    assert state.best_metric == pytest.approx((weight_after(3) - 1) ** 2, abs=1e-7)
    output_dir = tmp_path / "lathe"
    assert os.path.basename(state.best_model_checkpoint) == "checkpoint-3"
    assert os.path.isdir(os.path.join(output_dir, state.best_model_checkpoint))
    assert torch.equal(trainer.model.linear.weight.detach(), saved_weight(output_dir, 3))
    assert trained_weight(trainer) == pytest.approx(weight_after(3), abs=1e-6)
    assert not torch.equal(trainer.model.linear.weight.detach(), saved_weight(output_dir, 5))  # not the last one


def test_load_best_model_at_end_by_a_greater_is_better_metric(tmp_path):
    trainer = scalar_job(
        tmp_path,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        compute_metrics=scripted_metric("score", [0.1, 0.5, 0.3, 0.2, 0.5]),
        metric_for_best_model="score",
    )
    assert trainer.args.greater_is_better is True  # derived: the metric is not a loss
    trainer.train()
    assert (trainer.state.best_global_step, trainer.state.best_metric) == (2, 0.5)  # a tie later is no improvement
    assert torch.equal(trainer.model.linear.weight.detach(), saved_weight(tmp_path / "lathe", 2))
    assert trained_weight(trainer) == pytest.approx(weight_after(2), abs=1e-6)


def _rotation_run(tmp_path, lib: str):
    lister = checkpoint_lister(lib, tmp_path / lib)
    trainer = scalar_job(
        tmp_path,
        lib,
        callbacks=[lister],
        save_strategy="steps",
        save_steps=1,
        save_total_limit=1,
        load_best_model_at_end=True,
    )
    trainer.train()
    return trainer, lister.listings, checkpoint_steps(tmp_path / lib)


def test_save_total_limit_one_keeps_the_newest_and_the_best(tmp_path):
    trainer, listings, final = _rotation_run(tmp_path, "lathe")
    # The best (step 3) survives rotation; while it is not the newest, the newest stays too.
    assert listings == [[1], [2], [3], [3, 4], [3, 5]]
    assert final == [3]
    assert trained_weight(trainer) == pytest.approx(weight_after(3), abs=1e-6)


@pytest.mark.hf
def test_save_total_limit_one_matches_transformers(tmp_path):
    _, our_listings, our_final = _rotation_run(tmp_path, "lathe")
    _, their_listings, their_final = _rotation_run(tmp_path, "hf")
    assert our_listings == their_listings
    assert our_final == their_final


def _save_best_run(tmp_path, lib: str, scores):
    trainer = scalar_job(
        tmp_path,
        lib,
        save_strategy="best",
        metric_for_best_model="score",
        compute_metrics=scripted_metric("score", scores),
    )
    trainer.train()
    return trainer, checkpoint_steps(tmp_path / lib)


@pytest.mark.parametrize("scores, saved", [([0.1, 0.5, 0.3, 0.6, 0.2], [1, 2, 4]), ([0.5, 0.4, 0.3, 0.2, 0.1], [1])])
def test_save_strategy_best_saves_exactly_when_the_metric_improves(tmp_path, scores, saved):
    trainer, steps = _save_best_run(tmp_path, "lathe", scores)
    assert steps == saved
    assert trainer.state.best_global_step == saved[-1]
    for step in saved:
        assert saved_weight(tmp_path / "lathe", step).item() == pytest.approx(weight_after(step), abs=1e-6)


@pytest.mark.hf
def test_save_strategy_best_matches_transformers(tmp_path):
    scores = [0.1, 0.5, 0.3, 0.6, 0.2]
    _, ours = _save_best_run(tmp_path, "lathe", scores)
    _, theirs = _save_best_run(tmp_path, "hf", scores)
    assert ours == theirs == [1, 2, 4]


def _unsaved_best_run(tmp_path, lib: str):
    trainer = scalar_job(
        tmp_path,
        lib,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        compute_metrics=scripted_metric("score", [0.9, 0.1, 0.2, 0.3]),
        metric_for_best_model="score",
    )
    trainer.train()
    return trainer


def test_best_model_checkpoint_stays_none_when_the_best_step_was_never_saved(tmp_path):
    trainer = _unsaved_best_run(tmp_path, "lathe")
    assert (trainer.state.best_global_step, trainer.state.best_metric) == (1, 0.9)
    assert trainer.state.best_model_checkpoint is None
    assert checkpoint_steps(tmp_path / "lathe") == [2, 4]
    # Nothing to load: the model keeps its last weights.
    assert trained_weight(trainer) == pytest.approx(weight_after(4), abs=1e-6)


@pytest.mark.hf
def test_unsaved_best_matches_transformers(tmp_path):
    ours = _unsaved_best_run(tmp_path, "lathe")
    theirs = _unsaved_best_run(tmp_path, "hf")
    assert theirs.state.best_model_checkpoint is None
    assert trained_weight(ours) == pytest.approx(trained_weight(theirs), abs=1e-7)
