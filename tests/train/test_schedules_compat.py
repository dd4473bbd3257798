"""transformers.optimization's schedule API in lathe.optimization: the named builders, GreedyLR
(lr_scheduler_type="greedy") and AdafactorSchedule, each compared with transformers' (`hf`)."""

from __future__ import annotations

import inspect

import pytest
import torch

import lathe.optimization as ours
from tests.train.trainer_helpers import Regression, make_trainer, regression_items, training_args

BUILDERS = {
    "get_constant_schedule": {},
    "get_constant_schedule_with_warmup": dict(num_warmup_steps=3),
    "get_linear_schedule_with_warmup": dict(num_warmup_steps=3, num_training_steps=20),
    "get_cosine_schedule_with_warmup": dict(num_warmup_steps=3, num_training_steps=20, num_cycles=0.7),
    "get_cosine_with_hard_restarts_schedule_with_warmup": dict(num_warmup_steps=3, num_training_steps=20, num_cycles=3),
    "get_polynomial_decay_schedule_with_warmup": dict(
        num_warmup_steps=2, num_training_steps=20, lr_end=1e-3, power=2.0
    ),
    "get_inverse_sqrt_schedule": dict(num_warmup_steps=4, timescale=7),
    "get_cosine_with_min_lr_schedule_with_warmup": dict(num_warmup_steps=3, num_training_steps=20, min_lr=0.01),
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate": dict(
        num_warmup_steps=3, num_training_steps=20, min_lr_rate=0.1, warmup_lr_rate=0.2
    ),
    "get_wsd_schedule": dict(num_warmup_steps=3, num_decay_steps=6, num_training_steps=20, decay_type="1-sqrt"),
}


def rates(module, name, options, steps=22) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    scheduler = getattr(module, name)(optimizer, **options)
    seen = []
    for _ in range(steps):
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return seen


@pytest.mark.hf
@pytest.mark.parametrize("name", list(BUILDERS))
def test_named_schedule_builders_match_transformers(name):
    theirs = pytest.importorskip("transformers.optimization")
    assert inspect.signature(getattr(ours, name)).parameters.keys() == (
        inspect.signature(getattr(theirs, name)).parameters.keys()
    )
    assert rates(ours, name, BUILDERS[name]) == pytest.approx(rates(theirs, name, BUILDERS[name]), abs=1e-12)


def test_a_named_builder_binds_what_get_scheduler_binds():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.2)
    options = dict(num_warmup_steps=2, num_training_steps=10)
    built = ours.get_scheduler(
        "polynomial", optimizer, scheduler_specific_kwargs={"power": 5.0, "lr_end": 1e-5}, **options
    )
    named = ours.get_polynomial_decay_schedule_with_warmup(optimizer, power=5.0, lr_end=1e-5, **options)
    assert built.lr_lambdas[0].func is named.lr_lambdas[0].func
    assert built.lr_lambdas[0].keywords == named.lr_lambdas[0].keywords


METRICS = [1.0, 0.9, 0.8, 0.7, 0.75, 0.76, 0.77, 0.78, 0.6, 0.5, 0.4, 0.41, 0.42, 0.43, 0.44, 0.45]


def greedy_run(module, **options):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.05})
    scheduler = module.GreedyLR(optimizer, **options)
    seen = []
    for metric in METRICS:
        scheduler.step(metric)
        seen.append(tuple(scheduler.get_last_lr()))
    return scheduler, seen


GREEDY_OPTIONS = {
    "defaults, short patience": dict(patience=1, factor=0.5, min_lr=0.01),
    "cooldown and warmup": dict(patience=1, factor=0.8, cooldown=2, warmup=1, min_lr=[0.01, 0.02], max_lr=0.3),
    "max mode, relative, smoothed": dict(mode="max", patience=0, threshold_mode="rel", smooth=True, window_size=3),
    "reset at the floor": dict(patience=0, factor=0.5, min_lr=0.04, reset_start=2),
}


@pytest.mark.hf
@pytest.mark.parametrize("case", list(GREEDY_OPTIONS))
def test_greedy_lr_follows_the_metric_as_transformers_and_its_state_crosses(case):
    theirs = pytest.importorskip("transformers.optimization")
    our_scheduler, our_rates = greedy_run(ours, **GREEDY_OPTIONS[case])
    their_scheduler, their_rates = greedy_run(theirs, **GREEDY_OPTIONS[case])
    assert our_rates == their_rates
    assert len(set(our_rates)) > 1  # it did move
    assert our_scheduler.state_dict() == their_scheduler.state_dict()
    fresh, _ = greedy_run(ours, **GREEDY_OPTIONS[case])
    fresh.load_state_dict(their_scheduler.state_dict())
    assert fresh.state_dict() == their_scheduler.state_dict()


def test_greedy_lr_rejects_bad_settings():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match="factor must be < 1.0"):
        ours.GreedyLR(optimizer, factor=1.5)
    with pytest.raises(ValueError, match="mode must be"):
        ours.GreedyLR(optimizer, mode="lowest")
    with pytest.raises(ValueError, match="expected 1 min_lrs"):
        ours.GreedyLR(optimizer, min_lr=[0.1, 0.2])


def greedy_trainer(tmp_path, library):
    options = dict(
        lr_scheduler_type="greedy",
        lr_scheduler_kwargs={"patience": 1, "factor": 0.5},
        eval_strategy="epoch",
        num_train_epochs=6,
        learning_rate=0.2,
        logging_strategy="epoch",
    )
    trainer = make_trainer(
        library,
        model=Regression(),
        args=training_args(tmp_path / library, library, **options),
        train_dataset=regression_items(8),
        eval_dataset=regression_items(8, seed=3),
    )
    trainer.train()
    return trainer


@pytest.mark.hf
def test_lr_scheduler_type_greedy_steps_on_the_evaluation_loss_as_in_transformers(tmp_path):
    theirs, mine = greedy_trainer(tmp_path, "transformers"), greedy_trainer(tmp_path, "lathe")
    assert type(mine.lr_scheduler).__name__ == "GreedyLR" and mine.lr_scheduler.patience == 1

    def history(trainer):
        return [
            (e["step"], e.get("learning_rate"), e.get("loss"), e.get("eval_loss"))
            for e in trainer.state.log_history[:-1]
        ]

    # Entry by entry: pytest.approx compares flat sequences only (pytest >= 9.2 refuses nested ones).
    assert len(history(mine)) == len(history(theirs))
    for ours_entry, their_entry in zip(history(mine), history(theirs)):
        assert ours_entry == pytest.approx(their_entry)
    assert len({lr for _, lr, _, _ in history(mine) if lr is not None}) > 1


@pytest.mark.hf
def test_adafactor_schedule_reports_adafactors_own_step_size_as_in_transformers(tmp_path):
    import transformers

    results = {}
    for library, module in (("lathe", ours), ("transformers", transformers.optimization)):
        model = Regression()
        optimizer = module.Adafactor(
            model.parameters(), scale_parameter=True, relative_step=True, warmup_init=True, lr=None
        )
        scheduler = module.AdafactorSchedule(optimizer)
        assert scheduler.get_last_lr() == [0.0]
        trainer = make_trainer(
            library,
            model=model,
            args=training_args(tmp_path / library, library, max_steps=4),
            train_dataset=regression_items(8),
            optimizers=(optimizer, scheduler),
        )
        trainer.train()
        results[library] = trainer
    mine, theirs = results["lathe"], results["transformers"]
    assert mine.optimizer.state_dict()["param_groups"][0]["lr"] > 0
    lrs = [entry["learning_rate"] for entry in mine.state.log_history if "learning_rate" in entry]
    assert lrs == [entry["learning_rate"] for entry in theirs.state.log_history if "learning_rate" in entry]
    assert torch.equal(mine.model.linear.weight, theirs.model.linear.weight)
