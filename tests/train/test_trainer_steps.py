"""Trainer step arithmetic (global_step, max_steps, logged epochs, when logs/evaluations/saves
happen), the accumulation invariant (k micro-batches of b = one batch of k·b), train_loss and the
non-finite loss filter."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from tests.train.trainer_helpers import (
    Regression,
    assert_weights_close,
    make_trainer,
    max_weight_difference,
    pad_collate,
    recording_callback,
    regression_items,
    tiny_llama,
    token_items,
    training_args,
)


def run_regression(tmp_path, library="lathe", items=None, callbacks=None, eval_items=None, **overrides):
    model = Regression()
    trainer = make_trainer(
        library,
        model=model,
        args=training_args(tmp_path / library, library, **overrides),
        train_dataset=items if items is not None else regression_items(10),
        eval_dataset=eval_items,
        callbacks=callbacks,
    )
    trainer.train()
    return trainer, model


def logged(trainer, key="loss"):
    """(step, value) of every training log entry that has `key`."""
    return [
        (entry["step"], entry[key]) for entry in trainer.state.log_history if key in entry and "train_loss" not in entry
    ]


# ---------------------------------------------------------------- step arithmetic

# (items, batch size, accumulation, options) -> global_step, epoch logged at each step, micro-batches run.
STEP_CASES = {
    # 5 batches, 5 updates per epoch, 3 epochs.
    "integer epochs": (10, 2, 1, {"num_train_epochs": 3}, 15, [k / 5 for k in range(1, 16)], 15),
    # 5 batches -> ceil(5/2) = 3 updates per epoch (windows of 2, 2, 1 batches); ceil(2.5 * 3) = 8 steps.
    "fractional epochs, accumulation remainder": (
        10,
        2,
        2,
        {"num_train_epochs": 2.5},
        8,
        [0.4, 0.8, 1.0, 1.4, 1.8, 2.0, 2.4, 2.8],
        14,
    ),
    # 5 batches -> ceil(5/3) = 2 updates per epoch (windows of 3 and 2 batches).
    "accumulation 3 of 5 batches": (10, 2, 3, {"num_train_epochs": 2}, 4, [0.6, 1.0, 1.6, 2.0], 10),
    # max_steps overrides num_train_epochs and cycles the data: 7 steps of a 3-update epoch.
    "max_steps cycles the data": (
        10,
        2,
        2,
        {"num_train_epochs": 1, "max_steps": 7},
        7,
        [0.4, 0.8, 1.0, 1.4, 1.8, 2.0, 2.4],
        12,
    ),
    # 4 batches (the last holds 1 item), 2 updates per epoch (3 + 1 batches); ceil(1.5 * 2) = 3 steps.
    "fractional epoch stops mid-epoch": (7, 2, 3, {"num_train_epochs": 1.5}, 3, [0.75, 1.0, 1.75], 7),
    # 11 items: 6 batches, or 5 with drop_last (the odd item is never seen).
    "without drop_last": (11, 2, 1, {"num_train_epochs": 1}, 6, [k / 6 for k in range(1, 7)], 6),
    "drop_last": (11, 2, 1, {"num_train_epochs": 1, "dataloader_drop_last": True}, 5, [k / 5 for k in range(1, 6)], 5),
}


@pytest.mark.parametrize("case", STEP_CASES, ids=list(STEP_CASES))
def test_step_arithmetic(tmp_path, case):
    count, batch_size, accumulation, options, expected_steps, expected_epochs, micro_batches = STEP_CASES[case]
    trainer, model = run_regression(
        tmp_path,
        items=regression_items(count),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        **options,
    )
    assert trainer.state.global_step == trainer.state.max_steps == expected_steps
    assert [step for step, _ in logged(trainer, "epoch")] == list(range(1, expected_steps + 1))
    assert [epoch for _, epoch in logged(trainer, "epoch")] == pytest.approx(expected_epochs, abs=1e-12)
    assert model.forward_calls == micro_batches
    if options.get("dataloader_drop_last"):
        assert set(model.batch_sizes) == {2}
    final = trainer.state.log_history[-1]
    assert final["step"] == expected_steps and final["epoch"] == pytest.approx(expected_epochs[-1])


@pytest.mark.hf
@pytest.mark.parametrize("case", STEP_CASES, ids=list(STEP_CASES))
def test_step_arithmetic_matches_transformers(tmp_path, case):
    count, batch_size, accumulation, options, *_ = STEP_CASES[case]
    runs = {}
    for library in ("lathe", "transformers"):
        runs[library] = run_regression(
            tmp_path,
            library,
            items=regression_items(count),
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            **options,
        )
    (ours, our_model), (theirs, their_model) = runs["lathe"], runs["transformers"]
    assert ours.state.global_step == theirs.state.global_step
    assert ours.state.max_steps == theirs.state.max_steps
    assert ours.state.num_train_epochs == theirs.state.num_train_epochs
    for key in ("epoch", "loss", "learning_rate", "grad_norm"):
        assert logged(ours, key) == logged(theirs, key), key
    assert our_model.forward_calls == their_model.forward_calls
    assert_weights_close(our_model, their_model, atol=0)


def test_ratio_steps_resolve_against_total_steps_and_the_final_step_evaluates_and_saves(tmp_path):
    """logging/eval/save steps below 1 are fractions of max_steps, rounded up: with 10 steps,
    0.25 -> every 3, 0.35 -> every 4, 0.45 -> every 5. Step 10 is no multiple of 3 or 4, yet it
    evaluates and saves (the final step always does under step strategies); like transformers, it
    does not log the loss off the logging grid (the run's loss is train_loss)."""
    recorder = recording_callback()
    trainer, _ = run_regression(
        tmp_path,
        callbacks=[recorder],
        eval_items=regression_items(4, seed=1),
        max_steps=10,
        logging_steps=0.25,
        eval_strategy="steps",
        eval_steps=0.35,
        save_strategy="steps",
        save_steps=0.45,
    )
    assert (trainer.state.logging_steps, trainer.state.eval_steps, trainer.state.save_steps) == (3, 4, 5)
    assert [step for step, _ in logged(trainer)] == [3, 6, 9]
    assert [step for step, _ in logged(trainer, "eval_loss")] == [4, 8, 10]
    assert [e for e in recorder.events if e.startswith("on_save")] == ["on_save:5", "on_save:10"]
    assert sorted(p.name for p in (tmp_path / "lathe").iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-10",
        "checkpoint-5",
    ]


def test_final_step_acts_when_it_comes_before_the_first_interval(tmp_path):
    """A run shorter than eval/save steps still evaluates and saves once, at its end; it logs no
    loss (transformers' rule: only on the logging grid), its loss is train_loss."""
    recorder = recording_callback()
    trainer, _ = run_regression(
        tmp_path,
        callbacks=[recorder],
        eval_items=regression_items(4, seed=1),
        max_steps=4,
        logging_steps=50,
        eval_strategy="steps",
        eval_steps=50,
        save_strategy="steps",
        save_steps=50,
    )
    assert [step for step, _ in logged(trainer)] == []
    assert trainer.state.log_history[-1]["train_loss"] > 0
    assert [step for step, _ in logged(trainer, "eval_loss")] == [4]
    assert [e for e in recorder.events if e.startswith("on_save")] == ["on_save:4"]


def test_epoch_strategies_act_at_each_epoch_end(tmp_path):
    """3 updates per epoch (5 batches, accumulation 2), 2 epochs: log, evaluate and save at steps 3 and 6."""
    recorder = recording_callback()
    trainer, _ = run_regression(
        tmp_path,
        callbacks=[recorder],
        eval_items=regression_items(4, seed=1),
        num_train_epochs=2,
        gradient_accumulation_steps=2,
        logging_strategy="epoch",
        eval_strategy="epoch",
        save_strategy="epoch",
    )
    assert [(step, epoch) for step, epoch in logged(trainer, "epoch")] == [(3, 1.0), (3, 1.0), (6, 2.0), (6, 2.0)]
    assert [step for step, _ in logged(trainer)] == [3, 6]
    assert [step for step, _ in logged(trainer, "eval_loss")] == [3, 6]
    assert [e for e in recorder.events if e.startswith("on_save")] == ["on_save:3", "on_save:6"]


def test_warmup_steps_as_a_ratio_of_total_steps(tmp_path):
    """warmup_steps=0.25 of 10 steps -> ceil(2.5) = 3 warmup steps, then linear decay to 0 at step 10;
    the logged learning rate is the one each step used."""
    trainer, _ = run_regression(tmp_path, max_steps=10, lr_scheduler_type="linear", warmup_steps=0.25)
    expected = [0.1 * s / 3 for s in range(3)] + [0.1 * (10 - s) / 7 for s in range(3, 10)]
    assert [lr for _, lr in logged(trainer, "learning_rate")] == pytest.approx(expected, abs=1e-12)


# ---------------------------------------------------------------- accumulation equivalence


def run_llama(tmp_path, name, items, batch_size, accumulation, **overrides):
    model = tiny_llama()
    options = dict(per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation, max_grad_norm=0)
    options.update(overrides)
    trainer = make_trainer(
        model=model,
        args=training_args(tmp_path / name, **options),
        train_dataset=items,
        data_collator=pad_collate,
    )
    trainer.train()
    return trainer, model


@pytest.mark.parametrize(
    "optim, learning_rate, count, options, atol",
    [
        ("sgd", 0.5, 12, {"max_steps": 3}, 1e-6),
        # Adam divides each gradient element by its own running magnitude, so elements whose gradient
        # is near zero turn float rounding noise into updates of up to ~lr: 6e-6 here, against 5e-3
        # when num_items_in_batch is not used (each micro-batch averaged on its own).
        ("adamw_torch", 1e-3, 12, {"max_steps": 3}, 2e-5),
        # 10 items in windows of 6 and 4: the short last window is normalised by its own tokens.
        ("sgd", 0.5, 10, {"num_train_epochs": 2}, 1e-6),
    ],
    ids=["sgd", "adamw", "short last window"],
)
def test_accumulated_micro_batches_equal_one_large_batch_for_a_causal_lm(
    tmp_path, optim, learning_rate, count, options, atol
):
    """k=3 micro-batches of b=2 padded sequences of different lengths = one batch of 6, because the
    summed token loss is divided by the label tokens of the whole window (num_items_in_batch), not
    averaged per micro-batch."""
    items = token_items(count)
    common = dict(optim=optim, learning_rate=learning_rate, **options)
    accumulated, small = run_llama(tmp_path, "accumulated", items, batch_size=2, accumulation=3, **common)
    single, large = run_llama(tmp_path, "single", items, batch_size=6, accumulation=1, **common)
    assert accumulated.state.global_step == single.state.global_step
    assert max_weight_difference(small, tiny_llama()) > 1e-3  # the runs really moved the weights
    assert_weights_close(small, large, atol=atol)
    assert [loss for _, loss in logged(accumulated)] == pytest.approx([loss for _, loss in logged(single)], abs=1e-6)


@pytest.mark.parametrize("count", [12, 10], ids=["equal windows", "short last window"])
def test_accumulated_micro_batches_equal_one_large_batch_for_a_mean_loss(tmp_path, count):
    """A model without **kwargs returns the mean over its micro-batch; the Trainer divides by the
    number of micro-batches in the window. With 10 items, the epoch's last window has 2 micro-batches,
    not 3, and must be divided by 2 to equal the batch of 4 it replaces."""
    items = regression_items(count)
    accumulated, small = run_regression(tmp_path / "a", items=items, num_train_epochs=2, gradient_accumulation_steps=3)
    single, large = run_regression(tmp_path / "b", items=items, num_train_epochs=2, per_device_train_batch_size=6)
    assert accumulated.state.global_step == single.state.global_step == 4
    assert_weights_close(small, large, atol=1e-6)


def test_short_last_window_is_scaled_by_its_own_size(tmp_path):
    """Plain-PyTorch reference for 10 items, batch 2, accumulation 3, one epoch: windows of 3 and 2
    micro-batches. Scaling the short window by 1/3 (the configured accumulation) instead of 1/2
    gives visibly different weights, so this pins the right one."""
    items = regression_items(10)

    def reference(short_window_divisor):
        model = Regression()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = [items[i : i + 2] for i in range(0, 10, 2)]
        for window, divisor in ((batches[:3], 3), (batches[3:], short_window_divisor)):
            for batch in window:
                x = torch.stack([item["x"] for item in batch])
                y = torch.stack([item["labels"] for item in batch])
                (model(x, y)["loss"] / divisor).backward()
            optimizer.step()
            optimizer.zero_grad()
        return model

    _, trained = run_regression(
        tmp_path, items=items, gradient_accumulation_steps=3, num_train_epochs=1, max_grad_norm=0
    )
    right, wrong = reference(2), reference(3)
    assert max_weight_difference(right, wrong) > 1e-3
    assert_weights_close(trained, right, atol=1e-6)


# ---------------------------------------------------------------- train_loss


def test_train_loss_is_the_mean_of_the_logged_losses(tmp_path):
    trainer, _ = run_regression(tmp_path, num_train_epochs=2, gradient_accumulation_steps=2)
    losses = [loss for _, loss in logged(trainer)]
    assert len(losses) == 6
    metrics = trainer.state.log_history[-1]
    assert metrics["train_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-6)


def test_train_loss_counts_every_step_also_those_after_the_last_log(tmp_path):
    """Logs at steps 3, 6 and 9 average their 3 steps each; step 10 is off the logging grid, so it is
    not logged (transformers' rule) but train_loss still averages all 10 steps. The per-step losses
    come from the same run logged at every step."""
    trainer, _ = run_regression(tmp_path, max_steps=10, logging_steps=3)
    every_step, _ = run_regression(tmp_path / "every", max_steps=10, logging_steps=1)
    step_losses = [loss for _, loss in logged(every_step)]
    entries = logged(trainer)
    assert [step for step, _ in entries] == [3, 6, 9]
    for (_, loss), start in zip(entries, (0, 3, 6)):
        assert loss == pytest.approx(sum(step_losses[start : start + 3]) / 3, rel=1e-6)
    output_loss = trainer.state.log_history[-1]["train_loss"]
    assert output_loss == pytest.approx(sum(step_losses) / 10, rel=1e-6)
    assert output_loss != pytest.approx(sum(loss for _, loss in entries) / 3, rel=1e-3)


# ---------------------------------------------------------------- non-finite losses


class NanOnce(Regression):
    """Returns a nan loss on its `bad_call`-th forward; the nan is a constant, so the gradient (and
    the weights) stay finite: only the logged loss can be affected."""

    def __init__(self, bad_call: int):
        super().__init__()
        self.bad_call = bad_call

    def forward(self, x, labels=None):
        outputs = super().forward(x, labels)
        if self.forward_calls == self.bad_call:
            outputs["loss"] = outputs["loss"] + torch.tensor(float("nan"))
        return outputs


def run_nan(tmp_path, library, nan_filter, **overrides):
    model = NanOnce(bad_call=4)
    options = dict(max_steps=6, logging_steps=2, logging_nan_inf_filter=nan_filter)
    options.update(overrides)
    trainer = make_trainer(
        library,
        model=model,
        args=training_args(tmp_path / f"{library}-{nan_filter}", library, **options),
        train_dataset=regression_items(12),
    )
    trainer.train()
    return trainer, model


def test_nan_inf_filter_keeps_the_logged_loss_finite(tmp_path, caplog):
    """Step 4 (the 2nd of the window logged at step 4) returns nan. With the filter it counts as the
    window's running mean so far (HF's rule): logged = (l3 + l3/2) / 2. Without it the log is nan.
    Either way the weights are the same: the filter only touches what is logged."""
    with caplog.at_level(logging.WARNING, logger="lathe"):
        filtered, filtered_model = run_nan(tmp_path, "lathe", True)
    assert "1 micro-batches had a non-finite loss" in caplog.text
    clean_trainer, _ = run_regression(tmp_path / "clean", items=regression_items(12), max_steps=6, logging_steps=1)
    clean = dict(logged(clean_trainer))
    losses = dict(logged(filtered))
    assert all(math.isfinite(value) for value in losses.values())
    assert losses[4] == pytest.approx((clean[3] + clean[3] / 2) / 2, rel=1e-6)
    assert losses[2] == pytest.approx((clean[1] + clean[2]) / 2, rel=1e-6)
    assert math.isfinite(filtered.state.log_history[-1]["train_loss"])

    caplog.clear()
    unfiltered, unfiltered_model = run_nan(tmp_path, "lathe", False)
    losses = dict(logged(unfiltered))
    assert math.isnan(losses[4]) and math.isfinite(losses[2]) and math.isfinite(losses[6])
    assert "non-finite loss" not in caplog.text
    assert_weights_close(filtered_model, unfiltered_model, atol=0)


@pytest.mark.hf
def test_nan_inf_filter_matches_transformers(tmp_path):
    ours, _ = run_nan(tmp_path, "lathe", True)
    theirs, _ = run_nan(tmp_path, "transformers", True)
    assert logged(ours) == logged(theirs)
    assert ours.state.log_history[-1]["train_loss"] == theirs.state.log_history[-1]["train_loss"]


@pytest.mark.hf
def test_without_the_filter_a_nan_spoils_only_its_own_log_window(tmp_path):
    """A real difference: transformers resets its running loss with `tr_loss -= tr_loss`, which
    leaves a nan in place, so every later logged loss (and train_loss) is nan too. lathe zeroes the
    running loss at each log, so only the window that held the nan logs nan."""
    ours, _ = run_nan(tmp_path, "lathe", False)
    theirs, _ = run_nan(tmp_path, "transformers", False)
    our_losses, their_losses = dict(logged(ours)), dict(logged(theirs))
    assert our_losses[2] == their_losses[2]
    assert math.isnan(our_losses[4]) and math.isnan(their_losses[4])
    assert math.isfinite(our_losses[6]) and math.isnan(their_losses[6])
