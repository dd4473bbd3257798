"""The callback contract of the training loop: the exact event sequence (the same as
transformers.Trainer's for the same job), the kwargs each event receives, the control-flag resets,
and the flags a user callback sets acting at that step."""

from __future__ import annotations

import pytest
import torch

from tests.train.trainer_helpers import (
    FLAGS,
    Regression,
    library_module,
    make_trainer,
    recording_callback,
    regression_items,
    training_args,
)


def run(tmp_path, library="lathe", callbacks=(), items=10, eval_items=None, **overrides):
    model = Regression()
    trainer = make_trainer(
        library,
        model=model,
        args=training_args(tmp_path / library, library, **overrides),
        train_dataset=regression_items(items),
        eval_dataset=regression_items(eval_items, seed=1) if eval_items else None,
        callbacks=list(callbacks),
    )
    trainer.train()
    return trainer


# Each shape: (train items, eval items, options). Batch size 2 throughout.
SHAPES = {
    # 3 updates per epoch, 6 steps: logs at 2, 4, 6; evaluations and saves at 3 and 6.
    "accumulation 1, eval/save steps": (
        6,
        4,
        dict(
            num_train_epochs=2,
            logging_steps=2,
            eval_strategy="steps",
            eval_steps=3,
            save_strategy="steps",
            save_steps=3,
        ),
    ),
    # 5 batches in windows of 3 and 2 (substep_end after all but the last micro-batch of each).
    "accumulation 3, epoch eval/save": (
        10,
        4,
        dict(
            num_train_epochs=2,
            gradient_accumulation_steps=3,
            logging_steps=2,
            eval_strategy="epoch",
            save_strategy="epoch",
        ),
    ),
    # Everything per epoch, plus the first-step log and an evaluation before training.
    "epoch strategies": (
        8,
        2,
        dict(
            num_train_epochs=2,
            gradient_accumulation_steps=2,
            logging_strategy="epoch",
            logging_first_step=True,
            eval_strategy="epoch",
            save_strategy="epoch",
            eval_on_start=True,
        ),
    ),
    # max_steps stops in the middle of the second epoch.
    "max_steps mid-epoch": (6, 0, dict(max_steps=4, logging_steps=2)),
}


def events_of(tmp_path, library, shape, record_flags=False):
    items, eval_items, options = SHAPES[shape]
    recorder = recording_callback(library, record_flags)
    run(tmp_path, library, [recorder], items=items, eval_items=eval_items, **options)
    return recorder.events


def test_event_sequence_with_accumulation(tmp_path):
    """Pinned explicitly for one shape: 5 batches in windows of 3 and 2, one epoch, a log every step."""
    events = events_of(tmp_path, "lathe", "accumulation 3, epoch eval/save")
    first_epoch = events[: events.index("on_epoch_end:2") + 1]
    assert first_epoch == [
        "on_init_end:0",
        "on_train_begin:0",
        "on_epoch_begin:0",
        "on_step_begin:0",
        "on_substep_end:0",
        "on_substep_end:0",
        "on_pre_optimizer_step:0",
        "on_optimizer_step:0",
        "on_step_end:1",
        "on_step_begin:1",
        "on_substep_end:1",
        "on_pre_optimizer_step:1",
        "on_optimizer_step:1",
        "on_step_end:2",
        "on_log:2",
        "on_epoch_end:2",
    ]
    assert events[len(first_epoch) : len(first_epoch) + 4] == [
        "on_prediction_step:2",
        "on_log:2",
        "on_evaluate:2",
        "on_save:2",
    ]
    assert events[-3:] == ["on_save:4", "on_log:4", "on_train_end:4"]


@pytest.mark.hf
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_event_sequence_matches_transformers(tmp_path, shape):
    assert events_of(tmp_path, "lathe", shape) == events_of(tmp_path, "transformers", shape)


@pytest.mark.hf
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_control_flags_seen_by_each_event_match_transformers(tmp_path, shape):
    """The five flags as every event sees them: the handler resets them at the same events."""
    assert events_of(tmp_path, "lathe", shape, True) == events_of(tmp_path, "transformers", shape, True)


@pytest.mark.hf
def test_final_step_off_the_logging_grid_is_not_logged_as_in_transformers(tmp_path):
    """5 steps, logging_steps=2: both log at 2 and 4 only; the loss of step 5 is in train_loss, and
    log_history, the events and the calls to log() are transformers' exactly."""
    options = dict(num_train_epochs=1, logging_steps=2)
    ours, theirs = recording_callback("lathe"), recording_callback("transformers")
    ours_trainer = run(tmp_path, "lathe", [ours], **options)
    theirs_trainer = run(tmp_path, "transformers", [theirs], **options)
    assert ours.events == theirs.events
    assert [e for e in ours.events if e.startswith("on_log")] == ["on_log:2", "on_log:4", "on_log:5"]
    steps = [entry["step"] for entry in ours_trainer.state.log_history]
    assert steps == [entry["step"] for entry in theirs_trainer.state.log_history] == [2, 4, 5]
    assert "loss" not in ours_trainer.state.log_history[-1] and "train_loss" in ours_trainer.state.log_history[-1]


def test_callbacks_receive_the_trainer_objects(tmp_path):
    processing_class = object()
    recorder = recording_callback()
    model = Regression()
    trainer = make_trainer(
        model=model,
        args=training_args(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=2),
        train_dataset=regression_items(6),
        eval_dataset=regression_items(2, seed=1),
        callbacks=[recorder],
        processing_class=processing_class,
    )
    trainer.train()
    for event in ("on_train_begin", "on_step_begin", "on_step_end", "on_log", "on_evaluate", "on_train_end"):
        kwargs = recorder.kwargs[event]
        assert kwargs["model"] is model, event
        assert kwargs["optimizer"] is trainer.optimizer and isinstance(kwargs["optimizer"], torch.optim.SGD), event
        assert kwargs["lr_scheduler"] is trainer.lr_scheduler and kwargs["lr_scheduler"] is not None, event
        assert isinstance(kwargs["train_dataloader"], torch.utils.data.DataLoader), event
        assert len(kwargs["train_dataloader"]) == 3, event
        assert kwargs["processing_class"] is processing_class, event
    assert recorder.kwargs["on_log"]["logs"]["loss"] == trainer.state.log_history[0]["loss"]
    assert recorder.kwargs["on_evaluate"]["metrics"]["eval_loss"] == trainer.state.log_history[2]["eval_loss"]
    assert len(recorder.kwargs["on_evaluate"]["eval_dataloader"]) == 1


class SetEverything(library_module("lathe").TrainerCallback):
    """Sets all five flags at every event it sees, to show which events clear which flags."""

    def _set(self, args, state, control, **kwargs):
        if state.global_step < 1:  # let step 1 run; from then on, everything is requested
            return
        for flag in FLAGS:
            setattr(control, flag, True)

    on_substep_end = on_optimizer_step = on_pre_optimizer_step = _set


def test_each_event_clears_the_flags_it_owns(tmp_path):
    """on_train_begin clears should_training_stop, on_epoch_begin should_epoch_stop, on_step_begin
    the three action flags, and on_log / on_evaluate / on_save their own flag before the callbacks
    see it. Flags set inside the step are acted on after on_step_end."""
    first = recording_callback(record_flags=True)
    trainer = make_trainer(
        model=Regression(),
        args=training_args(tmp_path, per_device_train_batch_size=1, gradient_accumulation_steps=2, num_train_epochs=2),
        train_dataset=regression_items(4),
        eval_dataset=regression_items(2, seed=1),
        callbacks=[SetEverything(), first],
    )
    trainer.train()
    seen = {}
    for event, step, flags in first.events:
        seen.setdefault((event, step), dict(zip(FLAGS, flags)))
    # step 2 is the second update (micro-batches 3 and 4): the callback sets every flag in it.
    assert seen[("on_step_begin", 1)] == dict.fromkeys(FLAGS, False)
    assert seen[("on_step_end", 2)] == dict.fromkeys(FLAGS, True)
    assert seen[("on_log", 2)]["should_log"] is False and seen[("on_log", 2)]["should_evaluate"] is True
    assert seen[("on_evaluate", 2)]["should_evaluate"] is False and seen[("on_evaluate", 2)]["should_save"] is True
    assert seen[("on_save", 2)]["should_save"] is False
    assert seen[("on_epoch_end", 2)]["should_epoch_stop"] is True
    assert trainer.state.global_step == 2  # should_training_stop ended the run after the first epoch
    assert (tmp_path / "checkpoint-2").is_dir()
    # A second train() starts with should_training_stop and should_epoch_stop cleared again.
    first.events.clear()
    trainer.train()
    assert first.events[0][:2] == ("on_train_begin", 0) and first.events[0][2][0] is False
    assert first.events[1][:2] == ("on_epoch_begin", 0) and first.events[1][2][1] is False


class RequestEarly(library_module("lathe").TrainerCallback):
    """Asks for a log, an evaluation and a save before the first step has begun."""

    def on_epoch_begin(self, args, state, control, **kwargs):
        control.should_log = control.should_evaluate = control.should_save = True


def test_step_begin_clears_requests_made_before_the_step(tmp_path):
    """Flags set before a step are dropped by on_step_begin: nothing is logged, evaluated or saved
    at step 1, because no callback asked during the step."""
    recorder = recording_callback(record_flags=True)
    trainer = run(
        tmp_path,
        callbacks=[RequestEarly(), recorder],
        eval_items=2,
        max_steps=2,
        logging_strategy="no",
        eval_strategy="no",
        save_strategy="no",
    )
    assert [entry["step"] for entry in trainer.state.log_history] == [2]  # the closing metrics only
    assert "train_loss" in trainer.state.log_history[0]
    assert not list(tmp_path.glob("**/checkpoint-*"))
    step_begins = [flags for event, _, flags in recorder.events if event == "on_step_begin"]
    assert step_begins == [(False,) * 5] * 2
    assert [event for event, _, _ in recorder.events if event in ("on_log", "on_evaluate", "on_save")] == ["on_log"]


def stop_at(flag, step=None, step_in_epoch=None, library="lathe"):
    """A callback that sets `flag` at global step `step`, or at the `step_in_epoch`-th update of each epoch."""

    class StopAt(library_module(library).TrainerCallback):
        def __init__(self):
            self.steps_in_epoch = 0

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.steps_in_epoch = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.steps_in_epoch += 1
            if state.global_step == step or self.steps_in_epoch == step_in_epoch:
                setattr(control, flag, True)

    return StopAt()


def test_should_training_stop_stops_at_that_step(tmp_path):
    recorder = recording_callback()
    trainer = run(tmp_path, callbacks=[stop_at("should_training_stop", step=3), recorder], num_train_epochs=3)
    assert trainer.state.global_step == 3
    assert trainer.state.max_steps == 15
    assert [e["step"] for e in trainer.state.log_history if "loss" in e] == [1, 2, 3]
    assert recorder.events[-5:] == ["on_step_end:3", "on_log:3", "on_epoch_end:3", "on_log:3", "on_train_end:3"]
    assert [e for e in recorder.events if e.startswith("on_epoch_begin")] == ["on_epoch_begin:0"]


def test_should_epoch_stop_ends_the_epoch_only(tmp_path):
    """5 updates per epoch; stopping each epoch after its 2nd update leaves 2 + 2 steps of 2 epochs."""
    trainer = run(tmp_path, callbacks=[stop_at("should_epoch_stop", step_in_epoch=2)], num_train_epochs=2)
    assert trainer.state.global_step == 4
    epochs = [e["epoch"] for e in trainer.state.log_history if "loss" in e]
    assert epochs == pytest.approx([0.2, 0.4, 1.2, 1.4])


@pytest.mark.hf
@pytest.mark.parametrize(
    "stop, options",
    [
        (dict(flag="should_training_stop", step=3), dict(num_train_epochs=3)),
        (dict(flag="should_epoch_stop", step_in_epoch=2), dict(num_train_epochs=2, gradient_accumulation_steps=2)),
    ],
    ids=["training stop", "epoch stop"],
)
def test_stopping_flags_match_transformers(tmp_path, stop, options):
    ours, theirs = recording_callback("lathe"), recording_callback("transformers")
    run(tmp_path, "lathe", [stop_at(**stop), ours], **options)
    run(tmp_path, "transformers", [stop_at(**stop, library="transformers"), theirs], **options)
    assert ours.events == theirs.events


class RequestAt(library_module("lathe").TrainerCallback):
    def __init__(self, step, flags):
        self.step, self.flags = step, flags

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            for flag in self.flags:
                setattr(control, flag, True)


def test_user_requested_log_evaluate_and_save_happen_at_that_step(tmp_path):
    """All three strategies are "no": only the callback's request at step 2 logs, evaluates and saves."""
    recorder = recording_callback()
    trainer = run(
        tmp_path,
        callbacks=[RequestAt(2, ("should_log", "should_evaluate", "should_save")), recorder],
        eval_items=2,
        max_steps=4,
        logging_strategy="no",
        eval_strategy="no",
        save_strategy="no",
    )
    history = trainer.state.log_history
    assert [(e["step"], sorted(e)[:2]) for e in history[:-1]] == [
        (2, ["epoch", "grad_norm"]),
        (2, ["epoch", "eval_loss"]),
    ]
    assert "train_loss" in history[-1]
    assert [e for e in recorder.events if e.startswith(("on_log", "on_evaluate", "on_save"))] == [
        "on_log:2",
        "on_log:2",
        "on_evaluate:2",
        "on_save:2",
        "on_log:4",
    ]
    checkpoints = sorted(p.name for p in (tmp_path / "lathe").iterdir() if p.name.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-2"]


def test_user_requested_log_covers_the_steps_since_the_last_log(tmp_path):
    """A log requested at step 3 (logging_steps=2) averages step 3 alone: the window since step 2."""
    trainer = run(tmp_path, callbacks=[RequestAt(3, ("should_log",))], max_steps=4, logging_steps=2)
    per_step = run(tmp_path / "every", max_steps=4, logging_steps=1)
    losses = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    single = {e["step"]: e["loss"] for e in per_step.state.log_history if "loss" in e}
    assert sorted(losses) == [2, 3, 4]
    assert losses[2] == pytest.approx((single[1] + single[2]) / 2, rel=1e-6)
    assert losses[3] == pytest.approx(single[3], rel=1e-6)
    assert losses[4] == pytest.approx(single[4], rel=1e-6)
