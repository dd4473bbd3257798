"""The global RNG moves as under transformers.Trainer in what real programs do: an evaluation during
training (its dataloader draws a base seed), a collator that draws at random (transformers collates
one batch ahead of the step), evaluation or prediction from a callback, predict() between two train()
calls, and a resumed run that skips batches. The model has dropout, so any difference in the draws
shows in the weights; each test runs both libraries and compares bit for bit."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.hf


class MLP(nn.Module):
    """A small regression MLP with dropout: every training forward draws from the global RNG."""

    def __init__(self, dropout: float = 0.3):
        super().__init__()
        torch.manual_seed(0)
        self.hidden = nn.Linear(4, 16)
        self.head = nn.Linear(16, 1)
        self.dropout = dropout

    def forward(self, x, labels=None):
        hidden = nn.functional.dropout(torch.relu(self.hidden(x)), self.dropout, self.training)
        prediction = self.head(hidden).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def items(count: int = 10, seed: int = 1) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(count, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(count)]


class NoisyCollator:
    """Random augmentation in the collator, from the global torch RNG (as MLM masking draws)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, features):
        self.calls += 1
        x = torch.stack([f["x"] for f in features])
        return {"x": x + 0.1 * torch.randn_like(x), "labels": torch.stack([f["labels"] for f in features])}


def make(library: str, output_dir, collator=None, callbacks=None, eval_dataset=None, **overrides):
    module = importlib.import_module(library)
    options = dict(
        output_dir=str(output_dir),
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=3,
        num_train_epochs=3,
        learning_rate=0.01,
        save_strategy="no",
        seed=0,
        dataloader_pin_memory=False,
    )
    options.update(overrides)
    return module.Trainer(
        model=MLP(),
        args=module.TrainingArguments(**options),
        train_dataset=items(),
        eval_dataset=eval_dataset if eval_dataset is not None else items(7, seed=2),
        data_collator=collator,
        callbacks=callbacks,
    )


def assert_same_weights(first: nn.Module, second: nn.Module) -> None:
    a, b = first.state_dict(), second.state_dict()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"weights differ (not bitwise equal): {different}"


def numbers(trainer) -> list[dict]:
    """The log history without timings."""
    return [
        {k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k}
        for entry in trainer.state.log_history
    ]


def both(tmp_path, **options):
    """transformers' and lathe's trainers after train(), built and run alike."""
    runs = []
    for library in ("transformers", "lathe"):
        trainer = make(library, tmp_path / library, **options)
        trainer.train()
        runs.append(trainer)
    return runs


@pytest.mark.parametrize(
    "options",
    [
        dict(eval_strategy="steps", eval_steps=2),
        dict(eval_strategy="epoch", gradient_accumulation_steps=2),
        dict(eval_strategy="steps", eval_steps=3, eval_on_start=True, eval_accumulation_steps=1),
    ],
    ids=["steps", "epoch, accumulation", "on start, eval accumulation"],
)
def test_training_after_an_evaluation_draws_as_transformers(tmp_path, options):
    theirs, ours = both(tmp_path, **options)
    assert_same_weights(theirs.model, ours.model)
    assert numbers(ours) == numbers(theirs)
    assert any("eval_loss" in entry for entry in numbers(ours))


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(gradient_accumulation_steps=2),  # 5 batches an epoch: windows of 2, 2 and 1
        dict(max_steps=4, gradient_accumulation_steps=3),  # stops mid-epoch, with a batch read ahead
        dict(eval_strategy="steps", eval_steps=2, gradient_accumulation_steps=2),
    ],
    ids=["plain", "accumulation", "max_steps", "evaluation"],
)
def test_a_random_collator_draws_where_transformers_collator_draws(tmp_path, options):
    collators = NoisyCollator(), NoisyCollator()
    runs = []
    for library, collator in zip(("transformers", "lathe"), collators):
        trainer = make(library, tmp_path / library, collator=collator, **options)
        trainer.train()
        runs.append(trainer)
    theirs, ours = runs
    assert collators[1].calls == collators[0].calls  # the batch read ahead is collated by both
    assert_same_weights(theirs.model, ours.model)
    assert numbers(ours) == numbers(theirs)


def test_a_random_collator_reads_one_batch_ahead(tmp_path):
    """Collate, collate, step, collate, step, ...: the order transformers' dataloader gives."""
    library_events = {}
    for library in ("transformers", "lathe"):
        events = []

        def collate(features, events=events):
            events.append("C")
            return NoisyCollator()(features)

        trainer = make(library, tmp_path / library, collator=collate, num_train_epochs=2)
        trainer.model.register_forward_pre_hook(lambda module, args, events=events: events.append("F"))
        trainer.train()
        library_events[library] = " ".join(events)
    assert library_events["lathe"] == library_events["transformers"]
    assert library_events["lathe"].startswith("C C F C F C F C F F C C F")  # 5 batches an epoch


def _evaluating_callback(library: str, method: str):
    module = importlib.import_module(library)

    class Evaluate(module.TrainerCallback):
        """Runs trainer.evaluate() or trainer.predict() at each epoch end (a common pattern)."""

        trainer = None

        def on_epoch_end(self, args, state, control, **kwargs):
            if method == "evaluate":
                self.trainer.evaluate()
            else:
                self.trainer.predict(items(5, seed=3))

    return Evaluate()


@pytest.mark.parametrize("method", ["evaluate", "predict"])
def test_evaluation_from_a_callback_draws_as_transformers(tmp_path, method):
    runs = []
    for library in ("transformers", "lathe"):
        callback = _evaluating_callback(library, method)
        trainer = make(library, tmp_path / library, callbacks=[callback], collator=NoisyCollator())
        callback.trainer = trainer
        trainer.train()
        runs.append(trainer)
    assert_same_weights(runs[0].model, runs[1].model)
    assert numbers(runs[1]) == numbers(runs[0])


def test_predict_between_two_training_runs_draws_as_transformers(tmp_path):
    runs = []
    for library in ("transformers", "lathe"):
        trainer = make(library, tmp_path / library, num_train_epochs=1)
        trainer.train()
        prediction = trainer.predict(items(5, seed=3))
        trainer.train()
        runs.append((trainer, prediction))
    (theirs, their_prediction), (ours, our_prediction) = runs
    assert torch.equal(torch.as_tensor(our_prediction.predictions), torch.as_tensor(their_prediction.predictions))
    assert_same_weights(theirs.model, ours.model)
    assert numbers(ours) == numbers(theirs)


@pytest.mark.parametrize("save_steps, accumulation", [(3, 1), (2, 2)], ids=["mid-epoch", "accumulation"])
def test_a_resumed_run_with_a_random_collator_draws_as_transformers(tmp_path, save_steps, accumulation):
    """transformers restores the checkpoint's RNG after reading the resumed epoch's first update (its
    skipped batches are not read; the window and the batch read ahead are): lathe restores it there too,
    so both libraries resume from one checkpoint to the same weights."""
    options = dict(save_strategy="steps", save_steps=save_steps, gradient_accumulation_steps=accumulation)
    theirs = make("transformers", tmp_path / "full", collator=NoisyCollator(), **options)
    theirs.train()
    checkpoint = str(tmp_path / "full" / f"checkpoint-{save_steps}")
    resumed = []
    for library in ("transformers", "lathe"):
        trainer = make(library, tmp_path / f"{library}-resumed", collator=NoisyCollator(), **options)
        trainer.train(resume_from_checkpoint=checkpoint)
        resumed.append(trainer)
    assert_same_weights(resumed[0].model, resumed[1].model)
    assert numbers(resumed[1]) == numbers(resumed[0])


def test_neftune_noise_and_evaluation_draw_as_transformers(tmp_path):
    """NEFTune's embedding noise comes from the global RNG at every training forward: with evaluations
    between the steps and attention dropout, the losses stay transformers' bit for bit."""
    from tests.train.trainer_helpers import pad_collate, tiny_llama, token_items

    logs = {}
    for library in ("transformers", "lathe"):
        module = importlib.import_module(library)
        args = module.TrainingArguments(
            output_dir=str(tmp_path / library),
            report_to="none",
            disable_tqdm=True,
            per_device_train_batch_size=2,
            num_train_epochs=2,
            save_strategy="no",
            logging_steps=1,
            neftune_noise_alpha=5.0,
            eval_strategy="steps",
            eval_steps=2,
        )
        trainer = module.Trainer(
            model=tiny_llama(attention_dropout=0.1),
            args=args,
            train_dataset=token_items(12),
            eval_dataset=token_items(5, seed=3),
            data_collator=pad_collate,
        )
        trainer.train()
        logs[library] = numbers(trainer)
    assert logs["lathe"] == logs["transformers"]


def _length_grouped(library: str, output_dir, **overrides):
    from tests.train.trainer_helpers import pad_collate, tiny_llama, token_items

    module = importlib.import_module(library)
    options = dict(
        output_dir=str(output_dir),
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        num_train_epochs=2,
        logging_steps=1,
        train_sampling_strategy="group_by_length",
        gradient_accumulation_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="no",
    )
    options.update(overrides)
    return module.Trainer(
        model=tiny_llama(attention_dropout=0.1),
        args=module.TrainingArguments(**options),
        train_dataset=token_items(12),
        eval_dataset=token_items(7, seed=2),
        data_collator=pad_collate,
    )


def test_length_grouped_order_is_transformers(tmp_path):
    """group_by_length: transformers draws the train order from the global RNG at each epoch's start and
    groups the eval set too, with a generator seeded by the seed; so do lathe's samplers."""
    shapes, logs = {}, {}
    for library in ("transformers", "lathe"):
        trainer = _length_grouped(library, tmp_path / library)
        seen = shapes[library] = []
        trainer.model.register_forward_pre_hook(
            lambda module, args, kwargs, seen=seen: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True
        )
        trainer.train()
        logs[library] = numbers(trainer)
    assert shapes["lathe"] == shapes["transformers"]
    assert logs["lathe"] == logs["transformers"]


def test_a_length_grouped_run_resumed_mid_epoch_is_transformers(tmp_path):
    options = dict(save_strategy="steps", save_steps=2, eval_strategy="no")
    _length_grouped("transformers", tmp_path / "full", **options).train()
    resumed = {}
    for library in ("transformers", "lathe"):
        trainer = _length_grouped(library, tmp_path / f"{library}-resumed", **options)
        trainer.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
        resumed[library] = trainer
    assert_same_weights(resumed["transformers"].model, resumed["lathe"].model)
    assert numbers(resumed["lathe"]) == numbers(resumed["transformers"])
