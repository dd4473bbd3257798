"""The Trainer's loop behaves as transformers 5.23's where transformers code can observe it (issue 17):
a second train(), the default output_dir, the training summary at log_level="info", a train dataloader
without .dataset, label smoothing and multi-label models. Each compared with transformers (`hf`)."""

from __future__ import annotations

import contextlib
import logging
import os

import pytest
import torch

from tests.train.trainer_helpers import (
    Regression,
    make_trainer,
    regression_items,
    training_args,
    weights,
)


def entries(trainer) -> list[tuple]:
    """log_history without timings: (step, loss or train_loss, learning_rate)."""
    return [
        (entry["step"], entry.get("loss", entry.get("train_loss")), entry.get("learning_rate"))
        for entry in trainer.state.log_history
    ]


def train_twice(tmp_path, library):
    model = Regression()
    options = dict(optim="adamw_torch", lr_scheduler_type="linear", learning_rate=0.05, max_steps=4, logging_steps=2)
    trainer = make_trainer(
        library,
        model=model,
        args=training_args(tmp_path / library, library, **options),
        train_dataset=regression_items(10),
    )
    trainer.train()
    first_optimizer, first_scheduler, after_first = trainer.optimizer, trainer.lr_scheduler, weights(model)
    trainer.train()
    return trainer, first_optimizer, first_scheduler, after_first


@pytest.mark.hf
def test_a_second_train_continues_the_trained_model_with_a_fresh_schedule_as_transformers(tmp_path):
    """transformers keeps the model and the optimizer (Adam's moments too) and rebuilds the schedule it
    made, so the second run starts again at the peak learning rate, from the trained weights."""
    ours, our_optimizer, our_scheduler, our_first = train_twice(tmp_path, "lathe")
    theirs, _, _, their_first = train_twice(tmp_path, "transformers")
    assert ours.optimizer is our_optimizer and ours.lr_scheduler is not our_scheduler
    assert entries(ours) == entries(theirs)
    assert [lr for _, _, lr in entries(ours)[:2]] == pytest.approx([0.0375, 0.0125])  # not the spent schedule's 0
    for name, tensor in weights(ours.model).items():
        assert torch.equal(tensor, weights(theirs.model)[name]), name
        assert not torch.equal(tensor, our_first[name]), name  # it trained on from the first run's weights
    assert ours.state.global_step == 4


def test_a_scheduler_passed_in_is_kept_by_a_second_train(tmp_path):
    model = Regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    trainer = make_trainer(
        model=model,
        args=training_args(tmp_path, max_steps=2),
        train_dataset=regression_items(4),
        optimizers=(optimizer, scheduler),
    )
    trainer.train()
    trainer.train()
    assert trainer.lr_scheduler is scheduler and scheduler.last_epoch == 4


@pytest.mark.hf
def test_trainer_without_args_uses_and_makes_transformers_default_output_dir(tmp_path, monkeypatch):
    import transformers

    import lathe

    for library, folder in (("lathe", tmp_path / "lathe"), ("transformers", tmp_path / "transformers")):
        folder.mkdir()
        monkeypatch.chdir(folder)
        trainer = (lathe if library == "lathe" else transformers).Trainer(model=Regression())
        assert trainer.args.output_dir == "tmp_trainer", library
        assert os.listdir(folder) == ["tmp_trainer"], library


@pytest.fixture(autouse=True)
def restore_library_logger():
    """log_level changes the "lathe" logger (as transformers' changes its own): undo it after each test."""
    library = logging.getLogger("lathe")
    level, handlers = library.level, list(library.handlers)
    yield
    library.setLevel(level)
    library.handlers[:] = handlers


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def summary_lines(tmp_path, library: str, logger_name: str, **options) -> list[str]:
    options.setdefault("log_level", "info")
    trainer = make_trainer(
        library,
        model=Regression(),
        args=training_args(tmp_path / library, library, **options),
        train_dataset=regression_items(10),
    )
    handler, logger = Lines(), logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        trainer.train()
    finally:
        logger.removeHandler(handler)
    start = next(i for i, line in enumerate(handler.messages) if "Running training" in line)
    return [line for line in handler.messages[start : start + 12] if line.startswith("  ") or "*****" in line]


@pytest.mark.hf
@pytest.mark.parametrize("options", [dict(max_steps=3, gradient_accumulation_steps=2), dict(num_train_epochs=2)])
def test_training_summary_at_log_level_info_has_transformers_lines(tmp_path, options):
    """The "***** Running training *****" block: the same lines, in the same order, as transformers'
    (log_level="info" sets the Trainer's logger to info in both)."""
    ours = summary_lines(tmp_path, "lathe", "lathe.train.trainer", **options)
    theirs = summary_lines(tmp_path, "transformers", "transformers.trainer", **options)
    assert ours == theirs
    assert ours[0] == "***** Running training *****" and len(ours) == 9
    assert "  Number of trainable parameters = 4" in ours


def test_log_level_error_silences_the_summary_and_passive_leaves_the_logger_alone(tmp_path):
    library = logging.getLogger("lathe")
    library.setLevel(logging.INFO)
    with pytest.raises(StopIteration):  # no "Running training" line at all
        summary_lines(tmp_path / "error", "lathe", "lathe.train.trainer", max_steps=1, log_level="error")
    assert library.level == logging.ERROR
    library.setLevel(logging.DEBUG)
    lines = summary_lines(tmp_path / "passive", "lathe", "lathe.train.trainer", max_steps=1, log_level="passive")
    assert library.level == logging.DEBUG and lines[0] == "***** Running training *****"


class BatchList:
    """A train "dataloader" without .dataset, as a get_train_dataloader override may return: re-iterable,
    with a length, yielding ready batches."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def batches_of(items, size=2):
    return [
        {key: torch.stack([item[key] for item in items[i : i + size]]) for key in items[0]}
        for i in range(0, len(items), size)
    ]


@pytest.mark.hf
def test_a_train_dataloader_without_dataset_trains_as_in_transformers(tmp_path):
    """Its size is estimated as len(loader) * per_device_train_batch_size (transformers' num_examples)."""
    results = {}
    for library in ("lathe", "transformers"):
        loader = BatchList(batches_of(regression_items(10)))
        base = make_trainer(library, model=Regression(), args=training_args(tmp_path / library, library))
        trainer_class = type(base)

        class OwnLoader(trainer_class):
            def get_train_dataloader(self, loader=loader):
                return loader

        trainer = OwnLoader(
            model=Regression(), args=training_args(tmp_path / library, library, num_train_epochs=2, logging_steps=2)
        )
        trainer.train()
        assert trainer.num_examples(loader) == 10
        results[library] = (entries(trainer)[:-1], weights(trainer.model), trainer.state.max_steps)
    assert results["lathe"][0] == results["transformers"][0] and results["lathe"][2] == 10
    for name, tensor in results["lathe"][1].items():
        assert torch.equal(tensor, results["transformers"][1][name]), name


def tiny_multi_label_classifier(seed=0):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
        problem_type="multi_label_classification",
    )
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification(config)


def multi_label_items(count=8):
    generator = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(1, 32, (6,), generator=generator),
            "labels": torch.randint(0, 2, (3,), generator=generator).float(),
        }
        for _ in range(count)
    ]


@pytest.mark.hf
def test_label_smoothing_is_disabled_for_a_multi_label_model_as_in_transformers(tmp_path):
    """BCE targets are per label, so smoothing (a softmax over classes) does not apply: both libraries
    warn, drop the smoother and train exactly as without smoothing."""
    losses = {}
    for library in ("lathe", "transformers"):
        for factor in (0.0, 0.2):
            options = dict(max_steps=3, label_smoothing_factor=factor, optim="adamw_torch", learning_rate=0.01)
            warns = pytest.warns(UserWarning, match="Label smoothing is not compatible with multi-label")
            with warns if factor else contextlib.nullcontext():
                trainer = make_trainer(
                    library,
                    model=tiny_multi_label_classifier(),
                    args=training_args(tmp_path / f"{library}{factor}", library, **options),
                    train_dataset=multi_label_items(),
                )
            assert trainer.label_smoother is None
            trainer.train()
            losses[library, factor] = [loss for _, loss, _ in entries(trainer)]
    assert losses["lathe", 0.2] == losses["lathe", 0.0] == losses["transformers", 0.2]


def test_callback_warnings_go_through_the_modules_loggers_with_the_names_in_the_message(tmp_path):
    """transformers' tests patch transformers.trainer_callback.logger.warning / transformers.trainer.logger
    and read the message: lathe's modules of those paths expose the loggers its warnings use, and the
    messages are formatted before they are logged."""
    from unittest.mock import patch

    import lathe.trainer
    import lathe.trainer_callback
    from lathe import CallbackHandler, EarlyStoppingCallback, ProgressCallback

    with patch.object(lathe.trainer_callback.logger, "warning") as warning:
        CallbackHandler([ProgressCallback()], None, None, None, None)
    assert "DefaultFlowCallback" in warning.call_args[0][0]
    with patch.object(lathe.trainer_callback.logger, "warning") as warning:
        make_trainer(model=Regression(), args=training_args(tmp_path), callbacks=[ProgressCallback, ProgressCallback])
    assert "ProgressCallback" in warning.call_args[0][0]

    options = dict(max_steps=2, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2)
    options.update(load_best_model_at_end=True, metric_for_best_model="loss")
    early = EarlyStoppingCallback()
    data = dict(train_dataset=regression_items(4), eval_dataset=regression_items(2, seed=1))
    make_trainer(model=Regression(), args=training_args(tmp_path, **options), callbacks=[early], **data).train()
    resumed = make_trainer(
        model=Regression(),
        args=training_args(tmp_path, restore_callback_states_from_checkpoint=True, **options),
        **data,
    )
    with patch.object(lathe.trainer.logger, "warning") as warning:
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    messages = [call[0][0] for call in warning.call_args_list]
    assert any(
        "callbacks not included in current configuration" in m and "EarlyStoppingCallback" in m for m in messages
    )


def test_errors_start_with_transformers_sentences(tmp_path):
    """Code written for transformers matches on these; lathe's detail follows them."""
    with pytest.raises(ValueError, match="`args.metric_for_best_model` must be provided"):
        training_args(tmp_path, eval_strategy="epoch", save_strategy="best")
    trainer = make_trainer(
        model=Regression(), args=training_args(tmp_path / "fresh"), train_dataset=regression_items(4)
    )
    with pytest.raises(ValueError, match="^Can't find a valid checkpoint at .*not a folder"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"^No valid checkpoint found in output directory \(.*fresh\)"):
        trainer.train(resume_from_checkpoint=True)


def changed_arguments_warning(tmp_path, library, logger_name):
    first = dict(max_steps=6, save_strategy="steps", save_steps=5, eval_strategy="steps", eval_steps=5)
    data = dict(train_dataset=regression_items(40), eval_dataset=regression_items(4, seed=1))
    folder = tmp_path / library
    make_trainer(library, model=Regression(), args=training_args(folder, library, **first), **data).train()
    second = dict(first, save_steps=10, eval_steps=10, per_device_train_batch_size=4)
    trainer = make_trainer(library, model=Regression(), args=training_args(folder, library, **second), **data)
    handler, logger = Lines(), logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        trainer.train(resume_from_checkpoint=str(folder / "checkpoint-5"))
    finally:
        logger.removeHandler(handler)
    return [message for message in handler.messages if "do not match the ones in the `trainer_state.json`" in message]


@pytest.mark.hf
def test_resuming_with_other_steps_or_batch_warns_with_transformers_lines(tmp_path):
    ours = changed_arguments_warning(tmp_path, "lathe", "lathe.train.trainer")
    theirs = changed_arguments_warning(tmp_path, "transformers", "transformers.trainer_utils")
    assert ours == theirs and len(ours) == 1
    assert "\tsave_steps: 10 (from args) != 5 (from trainer_state.json)" in ours[0]
    assert "\tper_device_train_batch_size: 4 (from args) != 2 (from trainer_state.json)" in ours[0]
