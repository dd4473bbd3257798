"""Exact resume, proved with numbers: a run interrupted at checkpoint-k and resumed by a fresh Trainer
(fresh model, same initial weights) ends with bitwise equal weights and the same log_history as the
uninterrupted run. The model has dropout and the sampler shuffles, so the RNG state and the data
position must both be restored exactly. Also: the checkpoint layout, safe loading, and the warnings
and errors of resume. Cross-compatibility with transformers.Trainer is in test_resume_hf.py."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset

from lathe import EarlyStoppingCallback, Trainer, TrainingArguments
from lathe.train.checkpoints import layout as ckpt
from lathe.train.checkpoints import loading
from tests.train.trainer_helpers import assert_same_weights, pad_collate, tiny_llama, token_items

ITEMS = 10  # with batch size 2: 5 batches per epoch
TIMING_KEYS = ("runtime", "per_second")


class DropoutNet(nn.Module):
    """A small MLP with dropout that records the ids of the samples it trains on, in order."""

    def __init__(self, features: int = 4, hidden: int = 16, dropout: float = 0.3, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.hidden = nn.Linear(features, hidden)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, 1)
        self.seen: list[int] = []

    def forward(self, x, labels=None, sample_id=None):
        if self.training and sample_id is not None:
            self.seen.extend(sample_id.tolist())
        prediction = self.head(self.dropout(torch.relu(self.hidden(x)))).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}

    def floating_point_ops(self, inputs) -> int:
        return 6 * inputs["x"].shape[0] * sum(p.numel() for p in self.parameters())


def regression_items(count: int = ITEMS) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(count, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(count, generator=generator)
    return [{"x": x[i], "labels": y[i], "sample_id": i} for i in range(count)]


def make_args(output_dir, **overrides) -> TrainingArguments:
    """AdamW with weight decay and a linear schedule with warmup (optimizer and scheduler state both
    matter), gradient clipping, the default shuffled sampler, a log every step."""
    options = dict(
        output_dir=str(output_dir),
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        per_device_train_batch_size=2,
        num_train_epochs=3,
        learning_rate=0.01,
        warmup_steps=2,
        weight_decay=0.01,
        save_steps=4,
        seed=0,
        dataloader_pin_memory=False,
    )
    options.update(overrides)
    return TrainingArguments(**options)


def train(output_dir, resume=None, model=None, train_dataset=None, trainer_kwargs=None, **overrides) -> Trainer:
    trainer = Trainer(
        model=model if model is not None else DropoutNet(),
        args=make_args(output_dir, **overrides),
        train_dataset=train_dataset if train_dataset is not None else regression_items(),
        **(trainer_kwargs or {}),
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def resumed_runs(tmp_path, full_dir, step: int, **options) -> dict[str, Trainer]:
    """Resume from checkpoint-<step> of `full_dir` in two ways: by its path, and with True from an
    output_dir that holds only that checkpoint (so "the newest checkpoint" is that one)."""
    source = os.path.join(str(full_dir), f"checkpoint-{step}")
    latest_dir = tmp_path / f"latest-{step}"
    shutil.copytree(source, latest_dir / f"checkpoint-{step}")
    make = options.pop("make_options", lambda: {})
    return {
        "path": train(tmp_path / f"path-{step}", resume=source, **make(), **options),
        "latest": train(latest_dir, resume=True, **make(), **options),
    }


def logged(trainer: Trainer, after_step: int = -1, upto_step: float = float("inf")) -> list[dict]:
    """log_history entries with after_step < step <= upto_step, without timings and without the
    final train summary (its train_loss averages only the steps that run trained)."""
    return [
        {key: value for key, value in entry.items() if not any(word in key for word in TIMING_KEYS)}
        for entry in trainer.state.log_history
        if after_step < entry["step"] <= upto_step and "train_loss" not in entry
    ]


def logged_with_timings(trainer: Trainer, after_step: int) -> list[dict]:
    return [entry for entry in trainer.state.log_history if entry["step"] > after_step and "loss" in entry]


def assert_resumed_exactly(full: Trainer, resumed: Trainer, step: int) -> None:
    """Bitwise equal weights; the same log entries after the resume point (loss, learning_rate,
    grad_norm, epoch, step, eval metrics); the entries up to it came back from the checkpoint."""
    assert_same_weights(full.model, resumed.model)
    after = logged(full, after_step=step)
    assert after, "the uninterrupted run logged nothing after the resume point"
    assert all({"loss", "learning_rate", "grad_norm", "epoch"} <= entry.keys() for entry in after if "loss" in entry)
    assert logged(resumed, after_step=step) == after
    assert logged(resumed, upto_step=step) == logged(full, upto_step=step)
    assert resumed.state.global_step == full.state.global_step
    assert resumed.state.epoch == full.state.epoch


def samples_after(full: Trainer, step: int, per_step: int) -> list[int]:
    return full.model.seen[step * per_step :]


# ---------------------------------------------------------------------------------------------
# Exact resume
# ---------------------------------------------------------------------------------------------


def test_resume_mid_epoch_is_bitwise_exact(tmp_path):
    full = train(tmp_path / "full")  # 15 steps, checkpoints at 4, 8, 12
    for step in (4, 8):  # inside epoch 0 (4 of 5 batches) and epoch 1 (3 of 5)
        for how, resumed in resumed_runs(tmp_path, tmp_path / "full", step).items():
            assert_resumed_exactly(full, resumed, step)
            assert resumed.model.seen == samples_after(full, step, per_step=2), how


def test_resume_at_an_epoch_boundary_is_bitwise_exact(tmp_path):
    full = train(tmp_path / "full", save_steps=5)
    for step in (5, 10):  # the end of epochs 0 and 1: the next epoch's iterator is not made yet
        for how, resumed in resumed_runs(tmp_path, tmp_path / "full", step, save_steps=5).items():
            assert_resumed_exactly(full, resumed, step)
            assert resumed.model.seen == samples_after(full, step, per_step=2), how


def test_resume_in_an_epoch_with_a_short_accumulation_window(tmp_path):
    # 5 batches per epoch, accumulation 3: windows of 3 then 2 (the short one is scaled by 2).
    options = dict(gradient_accumulation_steps=3, save_steps=3)
    full = train(tmp_path / "full", **options)
    assert full.state.global_step == 6
    for how, resumed in resumed_runs(tmp_path, tmp_path / "full", 3, **options).items():
        # checkpoint-3 is epoch 1 after its full window: the resumed run starts with the short one.
        assert_resumed_exactly(full, resumed, 3)
        assert resumed.model.seen == full.model.seen[ITEMS + 6 :], how
    assert [entry["epoch"] for entry in logged(full, after_step=3)] == pytest.approx(
        [2.0, 2.6, 3.0]
    )  # short, full, short


def frozen_net() -> DropoutNet:
    model = DropoutNet()
    model.hidden.weight.requires_grad_(False)
    return model


def test_resume_with_frozen_parameters(tmp_path):
    initial = frozen_net().hidden.weight.detach().clone()
    full = train(tmp_path / "full", model=frozen_net())
    runs = resumed_runs(tmp_path, tmp_path / "full", 8, make_options=lambda: {"model": frozen_net()})
    for resumed in runs.values():
        assert_resumed_exactly(full, resumed, 8)
        assert torch.equal(resumed.model.hidden.weight, initial)
        assert not resumed.model.hidden.weight.requires_grad
    # the optimizer holds (and saved) state for the trainable tensors only
    saved = loading.safe_torch_load(str(tmp_path / "full" / "checkpoint-8" / ckpt.OPTIMIZER_NAME))
    assert len(saved["state"]) == 3  # hidden.bias, head.weight, head.bias


def test_shuffled_sampler_order_after_resume_equals_the_uninterrupted_run(tmp_path):
    full = train(tmp_path / "full", save_steps=7)
    epochs = [full.model.seen[i * ITEMS : (i + 1) * ITEMS] for i in range(3)]
    assert all(sorted(order) == list(range(ITEMS)) for order in epochs)
    assert epochs[0] != list(range(ITEMS)) and len({tuple(order) for order in epochs}) == 3  # shuffled, per epoch
    resumed = train(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-7"), save_steps=7)
    assert resumed.model.seen == full.model.seen[14:]
    assert_resumed_exactly(full, resumed, 7)


class OutOfMemoryAbove(DropoutNet):
    """Raises the message a CUDA allocation failure carries when a batch is larger than `limit`."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit
        self.batch_sizes: list[int] = []

    def forward(self, x, labels=None, sample_id=None):
        self.batch_sizes.append(x.shape[0])
        if x.shape[0] > self.limit:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return super().forward(x, labels, sample_id)


def test_auto_find_batch_size_resumes_with_the_reduced_batch_size(tmp_path, caplog):
    # One retry (each costs a gc.collect(), a third of a second in a big test process).
    options = dict(auto_find_batch_size=True, per_device_train_batch_size=5, num_train_epochs=2, save_steps=3)
    data = regression_items(16)
    with caplog.at_level(logging.WARNING):
        full = train(tmp_path / "full", model=OutOfMemoryAbove(4), train_dataset=data, **options)
    assert full.model.batch_sizes[0] == 5  # then int(0.9 * 5) = 4
    assert set(full.model.batch_sizes[1:]) == {4} and full.state.global_step == 8
    assert "retrying with 4" in caplog.text
    state = json.loads((tmp_path / "full" / "checkpoint-3" / ckpt.TRAINER_STATE_NAME).read_text())
    assert state["train_batch_size"] == 4
    caplog.clear()
    for how, resumed in resumed_runs(
        tmp_path,
        tmp_path / "full",
        3,
        make_options=lambda: {"model": OutOfMemoryAbove(4)},
        train_dataset=data,
        **options,
    ).items():
        assert set(resumed.model.batch_sizes) == {4}, how  # no new search: it starts at 4
        assert resumed._train_batch_size == 4 and resumed.state.train_batch_size == 4
        assert_resumed_exactly(full, resumed, 3)
        assert resumed.model.seen == full.model.seen[12:]
    assert "retrying" not in caplog.text and "differ" not in caplog.text


def test_evaluation_between_save_and_resume_keeps_resume_exact(tmp_path):
    options = dict(eval_strategy="epoch", save_steps=3, trainer_kwargs={"eval_dataset": regression_items(6)})
    full = train(tmp_path / "full", **options)
    assert [entry["step"] for entry in full.state.log_history if "eval_loss" in entry] == [5, 10, 15]
    # checkpoint-3: an evaluation (step 5) happens before the run gets past the next save;
    # checkpoint-6: one happened just before the save, inside the interrupted run.
    for step in (3, 6):
        for how, resumed in resumed_runs(tmp_path, tmp_path / "full", step, **options).items():
            assert_resumed_exactly(full, resumed, step)
            assert [e for e in logged(resumed, step) if "eval_loss" in e] == [
                e for e in logged(full, step) if "eval_loss" in e
            ], how


def test_ignore_data_skip_restarts_the_resumed_epoch_from_its_first_batch(tmp_path):
    full = train(tmp_path / "full")
    epoch_order = [full.model.seen[i * ITEMS : (i + 1) * ITEMS] for i in range(3)]
    resumed = train(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-8"), ignore_data_skip=True)
    # checkpoint-8 is epoch 1 after 3 of its 5 batches. Epoch 0 is still skipped (whole epochs are,
    # as in transformers); epoch 1 restarts at its first batch; global_step goes on from 8 and the
    # run stops at max_steps = 15, two batches into epoch 2.
    assert resumed.model.seen == epoch_order[1] + epoch_order[2][:4]
    steps = logged(resumed, after_step=8)
    assert [entry["step"] for entry in steps] == list(range(9, 16))
    assert [entry["epoch"] for entry in steps] == pytest.approx([1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4])
    assert resumed.state.global_step == 15
    # the learning rates continue the schedule from step 8 (the scheduler state was restored)
    assert [entry["learning_rate"] for entry in steps] == [
        entry["learning_rate"] for entry in logged(full, after_step=8)
    ]


class CountingStream(IterableDataset):
    """An iterable dataset that counts the items it yields (to show skipped batches are consumed)."""

    def __init__(self, items):
        self.items = items
        self.yielded = 0

    def __iter__(self):
        for item in self.items:
            self.yielded += 1
            yield item


def test_iterable_dataset_with_max_steps_resumes_by_consuming_the_skipped_batches(tmp_path):
    options = dict(max_steps=8, save_steps=3)
    full = train(tmp_path / "full", train_dataset=CountingStream(regression_items(20)), **options)
    assert full.model.seen == list(range(16))  # an iterable dataset keeps its own order
    for step in (3, 6):
        stream = CountingStream(regression_items(20))
        resumed = train(
            tmp_path / f"resumed-{step}",
            resume=str(tmp_path / "full" / f"checkpoint-{step}"),
            train_dataset=stream,
            **options,
        )
        assert resumed.model.seen == list(range(2 * step, 16))
        assert stream.yielded >= 16  # the skipped items were read and dropped, not seeked past
        assert_resumed_exactly(full, resumed, step)


class NoisyCollator:
    """Random augmentation in the collator (the main process draws from the global torch RNG)."""

    def __call__(self, features):
        from lathe.train.data.collators import default_data_collator

        batch = default_data_collator(features)
        batch["x"] = batch["x"] + 0.1 * torch.randn_like(batch["x"])
        return batch


@pytest.mark.parametrize(
    "accumulation, step, expected_seen",
    [
        # 10 items = 5 batches per pass over the stream, 8 steps: checkpoint-6 is 1 batch into the second pass.
        (1, 6, [2, 3, 4, 5]),
        # windows of 2, 2 and a short 1 per pass (3 steps a pass), 7 steps: checkpoint-5 is 4 batches
        # into the second pass; global_step * accumulation = 10 batches would point past it.
        (2, 5, [8, 9, 0, 1, 2, 3]),
    ],
)
def test_iterable_dataset_resumes_exactly_in_a_later_pass(tmp_path, accumulation, step, expected_seen):
    options = dict(
        max_steps=8 if accumulation == 1 else 7,
        save_steps=step,
        gradient_accumulation_steps=accumulation,
    )
    full = train(tmp_path / "full", train_dataset=CountingStream(regression_items(10)), **options)
    assert full.model.seen == list(range(10)) + (
        list(range(6)) if accumulation == 1 else list(range(10)) + [0, 1, 2, 3]
    )
    resumed = train(
        tmp_path / "resumed",
        resume=str(tmp_path / "full" / f"checkpoint-{step}"),
        train_dataset=CountingStream(regression_items(10)),
        **options,
    )
    assert resumed.model.seen == expected_seen
    assert_resumed_exactly(full, resumed, step)


def test_random_augmentation_in_the_collator_is_reproduced_after_resume_at_an_epoch_boundary(tmp_path):
    """At an epoch boundary nothing was read ahead when the checkpoint was saved, so the restored RNG
    collates the next epoch's first batches as the uninterrupted run did. Mid-epoch, the batch read
    ahead before the save was collated with draws the checkpoint does not hold: there lathe resumes
    as transformers does (test_real_programs_rng), not bit for bit."""
    options = dict(trainer_kwargs={"data_collator": NoisyCollator()}, save_steps=5)
    full = train(tmp_path / "full", **options)
    for step in (5, 10):
        resumed = train(tmp_path / f"resumed-{step}", resume=str(tmp_path / "full" / f"checkpoint-{step}"), **options)
        assert_resumed_exactly(full, resumed, step)


@pytest.mark.slow
def test_resume_with_a_dataloader_worker(tmp_path):
    # The worker's base seed is drawn from the global RNG at iter(), in the main process. Randomness
    # *inside* workers (augmentation in a worker's collator) is not reproduced after a mid-epoch
    # resume, here as in transformers: the resumed iterator's seed is drawn before the checkpoint's
    # RNG is restored, and a worker's stream advances per batch it makes, skipped ones included.
    options = dict(dataloader_num_workers=1, save_steps=8)
    full = train(tmp_path / "full", **options)
    resumed = train(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-8"), **options)
    assert_resumed_exactly(full, resumed, 8)


def test_resume_position():
    from lathe.train.batching import ResumePosition, TrainingPlan, resume_position

    mapped = TrainingPlan(
        batches_per_epoch=5, updates_per_epoch=2, max_steps=6, num_train_epochs=3, num_train_samples=30
    )
    assert resume_position(3, mapped, 3, False) == ResumePosition(1, 1, 3)  # windows of 3 + 2 per epoch
    assert resume_position(4, mapped, 3, False) == ResumePosition(2, 0, 0)
    assert resume_position(3, mapped, 3, True) == ResumePosition(1, 0, 0)  # ignore_data_skip: epoch restarts
    assert resume_position(6, mapped, 3, False) == ResumePosition(3, 0, 0)  # nothing left: past the last epoch
    stream = TrainingPlan(
        batches_per_epoch=None, updates_per_epoch=None, max_steps=7, num_train_epochs=2**62, num_train_samples=None
    )
    # An iterable dataset's position comes from the state's epoch: pass + batches / (max_steps * accumulation).
    assert resume_position(5, stream, 3, False, epoch=1 + 4 / 21) == ResumePosition(1, 0, 4)
    assert resume_position(5, stream, 3, False, epoch=None) == ResumePosition(0, 0, 15)  # no epoch: from pass 0
    assert resume_position(5, stream, 3, True, epoch=1 + 4 / 21) == ResumePosition(0, 0, 0)
    assert resume_position(7, stream, 3, False, epoch=2.5) == ResumePosition(2**62, 0, 0)


# ---------------------------------------------------------------------------------------------
# Stateful callbacks and TrainerState
# ---------------------------------------------------------------------------------------------

SCORES = {1: 1.0, 2: 0.5, 3: 0.5, 4: 0.5, 5: 0.5, 6: 0.5, 7: 0.5, 8: 0.5}  # best at step 1, then flat


def early_stopping_run(output_dir, resume=None, restore=False):
    """Evaluate every step with a scripted score (by global step): no improvement after step 1, so
    with patience 3 the uninterrupted run stops at step 4."""
    holder = {}
    callback = EarlyStoppingCallback(early_stopping_patience=3)
    trainer = Trainer(
        model=DropoutNet(),
        args=make_args(
            output_dir,
            eval_strategy="steps",
            eval_steps=1,
            save_steps=3,
            max_steps=8,
            metric_for_best_model="score",
            restore_callback_states_from_checkpoint=restore,
        ),
        train_dataset=regression_items(),
        eval_dataset=regression_items(4),
        callbacks=[callback],
        compute_metrics=lambda prediction: {"score": SCORES[holder["trainer"].state.global_step]},
    )
    holder["trainer"] = trainer
    trainer.train(resume_from_checkpoint=resume)
    return trainer, callback


def test_early_stopping_patience_is_restored_only_when_asked(tmp_path):
    full, full_callback = early_stopping_run(tmp_path / "full")
    assert full.state.global_step == 4 and full_callback.early_stopping_patience_counter == 3
    saved = json.loads((tmp_path / "full" / "checkpoint-3" / ckpt.TRAINER_STATE_NAME).read_text())
    assert saved["stateful_callbacks"]["EarlyStoppingCallback"] == {
        "args": {"early_stopping_patience": 3, "early_stopping_threshold": 0.0},
        "attributes": {"early_stopping_patience_counter": 2},
    }
    source = str(tmp_path / "full" / "checkpoint-3")
    restored, restored_callback = early_stopping_run(tmp_path / "restored", source, restore=True)
    assert restored.state.global_step == 4 and restored_callback.early_stopping_patience_counter == 3
    assert_resumed_exactly(full, restored, 3)
    # without restore_callback_states_from_checkpoint the counter starts again at 0: 3 more steps
    fresh, fresh_callback = early_stopping_run(tmp_path / "fresh", source, restore=False)
    assert fresh.state.global_step == 6 and fresh_callback.early_stopping_patience_counter == 3
    # TrainerState came back either way: the best metric (so 0.5 is not a new best) and its step
    for trainer in (restored, fresh):
        assert trainer.state.best_metric == 1.0 and trainer.state.best_global_step == 1
        assert logged(trainer, upto_step=3) == logged(full, upto_step=3)
        assert trainer.state.total_flos == trainer.state.global_step * 6 * 2 * 97


def test_trainer_state_counters_continue_across_resume(tmp_path):
    full = train(tmp_path / "full")
    resumed = train(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-8"))
    # floating_point_ops: 6 * batch (2) * parameters (97) per micro-batch
    assert full.state.total_flos == 15 * 6 * 2 * 97
    assert resumed.state.total_flos == full.state.total_flos
    assert resumed.state.log_history[-1]["total_flos"] == full.state.log_history[-1]["total_flos"]
    assert_resumed_exactly(full, resumed, 8)


def scored_run(output_dir, scores: dict, resume=None, **overrides) -> Trainer:
    """Evaluate (and save) every 2 steps; the metric is scripted by global step."""
    holder = {}
    options = dict(eval_strategy="steps", eval_steps=2, save_steps=2, metric_for_best_model="score")
    options.update(overrides)
    trainer = Trainer(
        model=DropoutNet(),
        args=make_args(output_dir, **options),
        train_dataset=regression_items(),
        eval_dataset=regression_items(4),
        compute_metrics=lambda prediction: {"score": scores[holder["trainer"].state.global_step]},
    )
    holder["trainer"] = trainer
    trainer.train(resume_from_checkpoint=resume)
    return trainer


BEST_AT_4 = {2: 0.5, 4: 0.9, 6: 0.7, 8: 0.6}


def test_best_model_is_found_after_resuming_elsewhere(tmp_path):
    """load_best_model_at_end after a resume: best_model_checkpoint ("<output_dir>/checkpoint-4", as
    transformers writes it) is found from another output_dir, from a moved or copied output folder
    (by its folder name, beside the resumed checkpoint first), and in a transformers checkpoint."""
    options = dict(load_best_model_at_end=True, max_steps=8)
    full = scored_run(tmp_path / "full", BEST_AT_4, **options)
    assert os.path.samefile(full.state.best_model_checkpoint, tmp_path / "full" / "checkpoint-4")
    assert full.state.best_metric == 0.9
    best_weights = safetensors_weights(tmp_path / "full" / "checkpoint-4")
    assert all(torch.equal(full.model.state_dict()[name], tensor) for name, tensor in best_weights.items())
    # by path into a fresh output_dir
    elsewhere = scored_run(tmp_path / "elsewhere", BEST_AT_4, resume=str(tmp_path / "full" / "checkpoint-6"), **options)
    assert elsewhere.state.best_model_checkpoint == str(tmp_path / "full" / "checkpoint-4")
    assert_same_weights(full.model, elsewhere.model)
    assert logged(elsewhere, after_step=6) == logged(full, after_step=6)
    # the output folder moved, then resume_from_checkpoint=True
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "full", moved)
    for name in os.listdir(moved):
        if name.startswith("checkpoint-") and int(name.split("-")[1]) > 6:
            shutil.rmtree(moved / name)
    resumed = scored_run(moved, BEST_AT_4, resume=True, **options)
    assert resumed.state.best_model_checkpoint == str(moved / "checkpoint-4")  # the copy, not the original
    assert_same_weights(full.model, resumed.model)
    # a checkpoint as transformers writes it: best_model_checkpoint is a path, and no manifest
    theirs = tmp_path / "theirs" / "checkpoint-6"
    shutil.copytree(tmp_path / "full" / "checkpoint-6", theirs)
    (theirs / ckpt.MANIFEST_NAME).unlink()
    state = json.loads((theirs / ckpt.TRAINER_STATE_NAME).read_text())
    state["best_model_checkpoint"] = str(tmp_path / "full" / "checkpoint-4")
    (theirs / ckpt.TRAINER_STATE_NAME).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    from_theirs = scored_run(tmp_path / "from-theirs", BEST_AT_4, resume=str(theirs), **options)
    assert_same_weights(full.model, from_theirs.model)


def safetensors_weights(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / ckpt.WEIGHTS_NAME))


# ---------------------------------------------------------------------------------------------
# A transformers model: save_pretrained layout, variable-length padding, num_items_in_batch
# ---------------------------------------------------------------------------------------------


def test_resume_a_transformers_causal_lm_with_padding_and_accumulation(tmp_path):
    # 12 items, batch 2, accumulation 2: 6 batches = 3 updates per epoch, 2 epochs = 6 steps.
    options = dict(
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        save_steps=4,
        include_num_input_tokens_seen="non_padding",
        train_dataset=token_items(),
        trainer_kwargs={"data_collator": pad_collate},
    )
    full = train(tmp_path / "full", model=tiny_llama(attention_dropout=0.2), **options)
    assert full.model_accepts_loss_kwargs  # the loss is divided by num_items_in_batch
    files = set(os.listdir(tmp_path / "full" / "checkpoint-4"))
    assert {
        "config.json",
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "trainer_state.json",
    } <= files
    for how, resumed in resumed_runs(
        tmp_path, tmp_path / "full", 4, make_options=lambda: {"model": tiny_llama(attention_dropout=0.2)}, **options
    ).items():
        assert_resumed_exactly(full, resumed, 4)
        assert (
            resumed.state.num_input_tokens_seen
            == full.state.num_input_tokens_seen
            == sum(len(i["input_ids"]) for i in token_items()) * 2
        )
        assert resumed.state.total_flos == full.state.total_flos > 0, how
        # tokens per second count this run's tokens only (those since the checkpoint), as transformers
        tokens_at_resume = next(e["num_input_tokens_seen"] for e in full.state.log_history if e["step"] == 4)
        for entry in logged_with_timings(resumed, after_step=4):
            session_tokens = entry["num_input_tokens_seen"] - tokens_at_resume
            assert entry["train_tokens_per_second"] * entry["train_runtime"] == pytest.approx(session_tokens, rel=0.05)


def test_resume_with_length_grouped_batches_at_an_epoch_boundary(tmp_path):
    # The length-grouped train order is drawn from the global RNG when an epoch starts (transformers'
    # sampler): at an epoch boundary the checkpoint's RNG is restored before that draw, so the resumed
    # run is exact. Mid-epoch it redraws the order, as transformers' resume does (test_real_programs_rng).
    options = dict(
        train_sampling_strategy="group_by_length",
        num_train_epochs=2,
        save_steps=6,  # 12 items in batches of 2: the end of epoch 0
        train_dataset=token_items(),
        trainer_kwargs={"data_collator": pad_collate},
    )
    full = train(tmp_path / "full", model=tiny_llama(attention_dropout=0.2), **options)
    resumed = train(
        tmp_path / "resumed",
        resume=str(tmp_path / "full" / "checkpoint-6"),
        model=tiny_llama(attention_dropout=0.2),
        **options,
    )
    assert_resumed_exactly(full, resumed, 6)


# ---------------------------------------------------------------------------------------------
# Warnings and errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting, value", [("per_device_train_batch_size", 5), ("gradient_accumulation_steps", 2)])
def test_resuming_with_a_changed_setting_warns_once_naming_it(tmp_path, caplog, setting, value):
    train(tmp_path / "full", max_steps=5, save_steps=4)
    with caplog.at_level(logging.WARNING, logger="lathe"):
        train(
            tmp_path / "resumed",
            resume=str(tmp_path / "full" / "checkpoint-4"),
            max_steps=5,
            save_steps=4,
            **{setting: value},
        )
    warnings = [record.getMessage() for record in caplog.records if "differ" in record.getMessage()]
    assert len(warnings) == 1, warnings
    assert setting in warnings[0] and "checkpoint-4" in warnings[0]


def test_resuming_with_the_same_settings_does_not_warn(tmp_path, caplog):
    train(tmp_path / "full", max_steps=5, save_steps=4)
    with caplog.at_level(logging.WARNING, logger="lathe"):
        train(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-4"), max_steps=5, save_steps=4)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_resuming_a_finished_checkpoint_says_there_is_nothing_left_to_train(tmp_path, caplog):
    full = train(tmp_path / "full", max_steps=4, save_steps=4)
    resumed_model = DropoutNet()
    with caplog.at_level(logging.WARNING, logger="lathe"):
        resumed = train(
            tmp_path / "resumed",
            resume=str(tmp_path / "full" / "checkpoint-4"),
            model=resumed_model,
            max_steps=4,
            save_steps=4,
        )
    assert "nothing left to train" in caplog.text and "max_steps=4" in caplog.text
    assert resumed.state.global_step == 4 and resumed_model.seen == []  # no step was taken
    assert_same_weights(full.model, resumed.model)


def test_a_save_only_model_checkpoint_cannot_be_resumed(tmp_path):
    train(tmp_path / "full", max_steps=4, save_steps=4, save_only_model=True)
    folder = tmp_path / "full" / "checkpoint-4"
    assert not (folder / ckpt.OPTIMIZER_NAME).exists() and (folder / ckpt.WEIGHTS_NAME).exists()
    with pytest.raises(ValueError, match="cannot resume") as error:
        train(tmp_path / "resumed", resume=str(folder), max_steps=8)
    assert "save_only_model" in str(error.value)
    with pytest.raises(ValueError, match="cannot resume"):
        train(tmp_path / "full", resume=True, max_steps=8)


def test_resume_true_without_a_checkpoint_names_the_output_dir(tmp_path):
    output_dir = tmp_path / "empty"
    with pytest.raises(ValueError, match="no complete checkpoint") as error:
        train(output_dir, resume=True)
    assert str(output_dir) in str(error.value)


def test_resume_from_a_path_that_is_not_a_folder_raises(tmp_path):
    a_file = tmp_path / "checkpoint-3"
    a_file.write_text("not a checkpoint")
    for path in (a_file, tmp_path / "missing"):
        with pytest.raises(ValueError, match="not a folder") as error:
            train(tmp_path / "out", resume=str(path))
        assert str(path) in str(error.value)


# ---------------------------------------------------------------------------------------------
# Layout and safe loading
# ---------------------------------------------------------------------------------------------


def test_checkpoint_layout(tmp_path):
    train(tmp_path / "full", max_steps=4, save_steps=4)
    folder = tmp_path / "full" / "checkpoint-4"
    assert {
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "trainer_state.json",
        "training_args.bin",
        "training_args.json",
    } <= set(os.listdir(folder))
    assert not (folder / ckpt.SCALER_NAME).exists()  # no fp16 on CPU
    rng = loading.safe_torch_load(str(folder / "rng_state.pth"))
    assert {"python", "numpy", "cpu"} <= rng.keys()
    for name in ("optimizer.pt", "scheduler.pt"):
        torch.load(folder / name, weights_only=True)
    text = (folder / "trainer_state.json").read_text()
    state = json.loads(text)
    assert text == json.dumps(state, indent=2, sort_keys=True) + "\n"
    assert state["global_step"] == 4 and state["train_batch_size"] == 2
    assert "TrainerControl" in state["stateful_callbacks"]
    assert json.loads((folder / "training_args.json").read_text())["per_device_train_batch_size"] == 2


def test_resume_never_unpickles_training_args_bin(tmp_path, monkeypatch):
    full = train(tmp_path / "full", max_steps=6, save_steps=4)
    real_load = torch.load
    loaded = []

    def guarded_load(path, *args, **kwargs):
        assert not str(path).endswith(ckpt.TRAINING_ARGS_NAME), "resume unpickled training_args.bin"
        assert kwargs.get("weights_only") is True, f"torch.load({path}) without weights_only=True"
        loaded.append(os.path.basename(str(path)))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", guarded_load)
    resumed = train(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-4"), max_steps=6, save_steps=4)
    assert sorted(loaded) == ["optimizer.pt", "rng_state.pth", "scheduler.pt"]
    assert_resumed_exactly(full, resumed, 4)


def test_a_model_with_split_files_loads_them_itself(tmp_path):
    """The hook for models whose save_pretrained writes several files (lathe.llm's reward model: the
    language model and value_head.safetensors): load_model_weights hands the folder to the model's own
    load_saved_weights, used for resume and the best model."""
    from lathe.train.checkpoints.weights import load_model_weights, save_model_weights

    class SplitFiles(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(2, 2), nn.Linear(2, 1)

        def save_pretrained(self, folder, state_dict=None):
            torch.save(
                {"body": self.body.state_dict(), "head": self.head.state_dict()}, os.path.join(folder, "parts.pt")
            )

        def load_saved_weights(self, folder):
            parts = torch.load(os.path.join(folder, "parts.pt"), weights_only=True)
            self.body.load_state_dict(parts["body"])
            self.head.load_state_dict(parts["head"])

    saved, loaded = SplitFiles(), SplitFiles()
    save_model_weights(saved, str(tmp_path))
    load_model_weights(loaded, str(tmp_path))
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), loaded.state_dict().values()))
