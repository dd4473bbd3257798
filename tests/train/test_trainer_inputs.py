"""What the Trainer accepts and how: model_init, optimizers, custom losses, dataset shapes (tuples,
iterables, datasets.Dataset, extra columns, length grouping), token counting, reporters, bf16,
gradient checkpointing, auto_find_batch_size, and the errors for inputs it cannot train on."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

from tests.train.trainer_helpers import (
    Regression,
    assert_weights_close,
    make_trainer,
    max_weight_difference,
    pad_collate,
    regression_items,
    tiny_llama,
    token_items,
    training_args,
)


def losses(trainer, key="loss"):
    return [entry[key] for entry in trainer.state.log_history if key in entry and "train_loss" not in entry]


class Tagger(nn.Module):
    """Per-token classifier (no **kwargs, not a causal LM): logits only, the loss is the Trainer's
    compute_loss_func's job. Records the length of every batch it sees."""

    def __init__(self, vocab: int = 64, classes: int = 64):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(vocab, 8)
        self.head = nn.Linear(8, classes)
        self.batches: list[torch.Tensor] = []

    def forward(self, input_ids, attention_mask=None, labels=None):
        self.batches.append(input_ids.detach().clone())
        return {"logits": self.head(self.embedding(input_ids))}


class Stream(IterableDataset):
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


# ---------------------------------------------------------------- models and optimizers


def test_model_init_gives_a_fresh_identical_model_to_each_train(tmp_path):
    """model_init is called under the seed before each train(), so two runs start from the same
    weights (the model does not seed itself) and end with the same weights and losses."""
    models = []

    def model_init():
        models.append(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)))
        return LossWrapper(models[-1])

    trainer = make_trainer(
        model_init=model_init, args=training_args(tmp_path, max_steps=4), train_dataset=regression_items(8)
    )
    trainer.train()
    first_losses, first_model = losses(trainer), trainer.model
    trainer.train()
    assert len(models) == 3  # __init__, then once per train()
    assert trainer.model is not first_model and trainer.model.inner is models[2]
    assert losses(trainer) == first_losses
    assert_weights_close(trainer.model, first_model, atol=0)
    assert max_weight_difference(trainer.model, LossWrapper(models[0])) > 1e-3  # model 0 was never trained


class LossWrapper(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, labels):
        return {"loss": ((self.inner(x).squeeze(-1) - labels) ** 2).mean()}


def reference_sgd(items, batch_size, steps, optimizer_factory, scheduler_factory=None):
    """Plain PyTorch: sequential batches, mean loss, one optimizer step per batch."""
    model = Regression()
    optimizer = optimizer_factory(model.parameters())
    scheduler = scheduler_factory(optimizer) if scheduler_factory else None
    for step in range(steps):
        batch = items[step * batch_size : (step + 1) * batch_size]
        x = torch.stack([item["x"] for item in batch])
        y = torch.stack([item["labels"] for item in batch])
        model(x, y)["loss"].backward()
        optimizer.step()
        if scheduler:
            scheduler.step()
        optimizer.zero_grad()
    return model


def test_optimizers_are_used_as_given(tmp_path):
    """optimizers=(SGD with momentum, a halving LambdaLR) replace args.optim / learning_rate / lr_scheduler_type."""

    def optimizer_factory(parameters):
        return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)

    def scheduler_factory(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)

    model = Regression()
    optimizer = optimizer_factory(model.parameters())
    scheduler = scheduler_factory(optimizer)
    trainer = make_trainer(
        model=model,
        args=training_args(tmp_path, max_steps=3, max_grad_norm=0, optim="adamw_torch", lr_scheduler_type="linear"),
        train_dataset=regression_items(6),
        optimizers=(optimizer, scheduler),
    )
    trainer.train()
    assert trainer.optimizer is optimizer and trainer.lr_scheduler is scheduler
    assert losses(trainer, "learning_rate") == [0.05, 0.025, 0.0125]
    assert_weights_close(
        model, reference_sgd(regression_items(6), 2, 3, optimizer_factory, scheduler_factory), atol=1e-7
    )


def test_optimizer_cls_and_kwargs(tmp_path):
    model = Regression()
    trainer = make_trainer(
        model=model,
        args=training_args(tmp_path, max_steps=3, max_grad_norm=0),
        train_dataset=regression_items(6),
        optimizer_cls_and_kwargs=(torch.optim.Adagrad, {"lr": 0.3}),
    )
    trainer.train()
    assert type(trainer.optimizer) is torch.optim.Adagrad
    assert losses(trainer, "learning_rate") == [0.3, 0.3, 0.3]
    expected = reference_sgd(regression_items(6), 2, 3, lambda parameters: torch.optim.Adagrad(parameters, lr=0.3))
    assert_weights_close(model, expected, atol=1e-7)


def summed_token_loss(calls):
    """A compute_loss_func that sums token losses and divides by num_items_in_batch, recording it."""

    def compute_loss(outputs, labels, num_items_in_batch=None):
        calls.append((int((labels != -100).sum()), num_items_in_batch))
        logits = outputs["logits"]
        total = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        return total / num_items_in_batch

    return compute_loss


def test_compute_loss_func_receives_the_label_tokens_of_the_whole_window(tmp_path):
    """Accumulation 2 of batches of 2: each call gets the window's count of labels != -100 (no shift:
    not a causal LM), so its micro-batch losses add up to the window's token mean, and the run equals
    one batch of 4."""
    items = token_items(8)
    calls, single_calls = [], []
    accumulated = make_trainer(
        model=Tagger(),
        args=training_args(tmp_path / "a", max_steps=2, gradient_accumulation_steps=2),
        train_dataset=items,
        data_collator=pad_collate,
        compute_loss_func=summed_token_loss(calls),
    )
    accumulated.train()
    lengths = [len(item["input_ids"]) for item in items]
    window_tokens = [sum(lengths[:4]), sum(lengths[4:])]
    assert [count for count in window_tokens] == [sum(c for c, _ in calls[:2]), sum(c for c, _ in calls[2:])]
    assert [int(n) for _, n in calls] == [window_tokens[0]] * 2 + [window_tokens[1]] * 2
    single = make_trainer(
        model=Tagger(),
        args=training_args(tmp_path / "b", max_steps=2, per_device_train_batch_size=4),
        train_dataset=items,
        data_collator=pad_collate,
        compute_loss_func=summed_token_loss(single_calls),
    )
    single.train()
    assert [int(n) for _, n in single_calls] == window_tokens
    assert_weights_close(accumulated.model, single.model, atol=1e-6)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 4)
        self.config = SimpleNamespace(problem_type=None)  # transformers reads config.problem_type for label smoothing

    def forward(self, x, labels=None):
        logits = self.linear(x)
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def classification_items(count=8):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(count, 3, generator=generator)
    return [{"x": x[i], "labels": int(i % 4)} for i in range(count)]


def test_label_smoothing_changes_the_loss(tmp_path):
    runs = {}
    for factor in (0.0, 0.2):
        trainer = make_trainer(
            model=Classifier(),
            args=training_args(tmp_path / str(factor), max_steps=1, label_smoothing_factor=factor),
            train_dataset=classification_items(),
        )
        trainer.train()
        runs[factor] = losses(trainer)[0]
    logits = Classifier().linear(torch.stack([item["x"] for item in classification_items()[:2]]))
    expected = nn.functional.cross_entropy(logits, torch.tensor([0, 1]), label_smoothing=0.2)
    assert runs[0.2] == pytest.approx(expected.item(), rel=1e-6)
    assert runs[0.2] != pytest.approx(runs[0.0], rel=1e-3)


@pytest.mark.hf
def test_label_smoothing_matches_transformers(tmp_path):
    results = {}
    for library in ("lathe", "transformers"):
        trainer = make_trainer(
            library,
            model=Classifier(),
            args=training_args(
                tmp_path / library,
                library,
                num_train_epochs=2,
                label_smoothing_factor=0.1,
                gradient_accumulation_steps=2,
            ),
            train_dataset=classification_items(),
            eval_dataset=classification_items(4),
        )
        trainer.train()
        results[library] = (losses(trainer), trainer.evaluate()["eval_loss"], trainer.model)
    (our_losses, our_eval, our_model), (their_losses, their_eval, their_model) = (
        results["lathe"],
        results["transformers"],
    )
    assert our_losses == their_losses
    assert our_eval == pytest.approx(their_eval, rel=1e-6)
    assert_weights_close(our_model, their_model, atol=0)


# ---------------------------------------------------------------- dataset shapes


class TupleRegression(Regression):
    """forward(x, y) -> (loss, prediction): the tuple-dataset contract, model(*batch)."""

    def forward(self, x, y):
        outputs = super().forward(x, y)
        return outputs["loss"], outputs["logits"]


def test_tuple_dataset_trains_like_the_dict_dataset(tmp_path):
    items = regression_items(8)
    tuples = TensorDataset(torch.stack([i["x"] for i in items]), torch.stack([i["labels"] for i in items]))
    by_tuple = make_trainer(
        model=TupleRegression(), args=training_args(tmp_path / "t", num_train_epochs=2), train_dataset=tuples
    )
    by_tuple.train()
    by_dict = make_trainer(
        model=Regression(), args=training_args(tmp_path / "d", num_train_epochs=2), train_dataset=items
    )
    by_dict.train()
    assert by_tuple.state.global_step == 8
    assert losses(by_tuple) == losses(by_dict)
    assert_weights_close(by_tuple.model, by_dict.model, atol=0)
    assert by_tuple.evaluate(tuples)["eval_loss"] == pytest.approx(by_dict.evaluate(items)["eval_loss"], rel=1e-6)


def test_iterable_dataset_with_max_steps_cycles_it(tmp_path):
    """10 items, batches of 2: the stream ends after 5 steps and restarts. An iterable dataset has no
    epoch length, so (like transformers) the epoch advances by 1/(max_steps * accumulation) per batch
    and jumps to the next whole number when the stream restarts."""
    model = Regression()
    trainer = make_trainer(
        model=model, args=training_args(tmp_path, max_steps=7), train_dataset=Stream(regression_items(10))
    )
    trainer.train()
    assert trainer.state.global_step == 7 and model.forward_calls == 7
    assert losses(trainer, "epoch") == pytest.approx([1 / 7, 2 / 7, 3 / 7, 4 / 7, 5 / 7, 1 + 1 / 7, 1 + 2 / 7])
    # The restarted stream gives the same batches again: step 6 sees step 1's inputs.
    by_list = make_trainer(
        model=Regression(), args=training_args(tmp_path / "list", max_steps=7), train_dataset=regression_items(10)
    )
    by_list.train()
    assert losses(trainer) == losses(by_list)


@pytest.mark.hf
def test_iterable_dataset_matches_transformers(tmp_path):
    runs = []
    for library in ("lathe", "transformers"):
        trainer = make_trainer(
            library,
            model=Regression(),
            args=training_args(tmp_path / library, library, max_steps=7),
            train_dataset=Stream(regression_items(10)),
        )
        trainer.train()
        runs.append(trainer)
    for key in ("epoch", "loss", "learning_rate", "grad_norm"):
        assert losses(runs[0], key) == losses(runs[1], key), key


def test_iterable_dataset_with_accumulation_steps_on_the_short_window_at_the_end_of_the_stream(tmp_path):
    """5 batches per pass in windows of 2, 2, 1: the last window of a pass is an update of its own,
    scaled by its own size, exactly like the last window of a map-style epoch (so the run equals the
    same list trained for ~2.3 epochs). A real difference from transformers, which carries the
    lone batch's gradient (scaled by 1, not 1/2) into the first update of the next pass."""
    model = Regression()
    trainer = make_trainer(
        model=model,
        args=training_args(tmp_path, max_steps=7, gradient_accumulation_steps=2),
        train_dataset=Stream(regression_items(10)),
    )
    trainer.train()
    assert model.forward_calls == 2 + 2 + 1 + 2 + 2 + 1 + 2
    assert losses(trainer, "epoch") == pytest.approx([e + b / 14 for e in (0, 1) for b in (2, 4, 5)] + [2 + 2 / 14])
    as_list = make_trainer(
        model=Regression(),
        args=training_args(tmp_path / "list", max_steps=7, gradient_accumulation_steps=2),
        train_dataset=regression_items(10),
    )
    as_list.train()
    assert losses(trainer) == losses(as_list)
    assert_weights_close(model, as_list.model, atol=0)


def test_iterable_dataset_without_max_steps_is_a_clear_error(tmp_path):
    trainer = make_trainer(model=Regression(), args=training_args(tmp_path), train_dataset=Stream(regression_items(4)))
    with pytest.raises(ValueError, match=r"no length.*max_steps"):
        trainer.train()


def test_group_by_length_batches_similar_lengths(tmp_path):
    """16 sequences, batches of 2: megabatches of 4 items, each sorted longest first, and the longest
    sequence of all in the first batch (so an out-of-memory error shows at step 1). Every item is seen
    once per epoch, and fewer padding tokens are trained on than in dataset order."""
    items = token_items(16, min_length=2, max_length=30, seed=3)
    lengths = sorted(len(item["input_ids"]) for item in items)
    runs = {}
    for strategy in ("group_by_length", "sequential"):
        model = Tagger()
        trainer = make_trainer(
            model=model,
            args=training_args(tmp_path / strategy, num_train_epochs=1, train_sampling_strategy=strategy),
            train_dataset=items,
            data_collator=pad_collate,
            compute_loss_func=summed_token_loss([]),
        )
        trainer.train()
        runs[strategy] = model.batches
    grouped = runs["group_by_length"]
    assert len(grouped) == 8
    assert grouped[0].shape[1] == lengths[-1]
    seen = sorted(int((row != 0).sum()) for batch in grouped for row in batch)
    assert seen == lengths
    padded = {strategy: sum(batch.numel() for batch in batches) for strategy, batches in runs.items()}
    assert padded["group_by_length"] < padded["sequential"]
    for first, second in zip(grouped[2::2], grouped[3::2]):  # within a megabatch: the longer batch first
        assert first.shape[1] >= second.shape[1]


class Strict(Regression):
    def forward(self, x, labels):  # no **kwargs: an unexpected key would fail here
        return super().forward(x, labels)


def test_remove_unused_columns_on_a_list_of_dicts(tmp_path):
    items = [{**item, "id": index, "text": f"sample {index}"} for index, item in enumerate(regression_items(6))]
    trainer = make_trainer(model=Strict(), args=training_args(tmp_path, max_steps=3), train_dataset=items)
    trainer.train()
    assert trainer.state.global_step == 3
    assert set(trainer.train_dataset[0]) == {"x", "labels", "id", "text"}  # the items themselves are untouched
    keep_all = make_trainer(
        model=Strict(),
        args=training_args(tmp_path, max_steps=3, remove_unused_columns=False),
        train_dataset=[{k: v for k, v in item.items() if k != "text"} for item in items],
    )
    with pytest.raises(TypeError, match="id"):
        keep_all.train()


def test_remove_unused_columns_on_a_datasets_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    items = regression_items(6)
    table = datasets.Dataset.from_list(
        [
            {"x": item["x"].tolist(), "labels": float(item["labels"]), "id": index, "text": "t"}
            for index, item in enumerate(items)
        ]
    ).with_format("torch")
    model = Strict()
    trainer = make_trainer(model=model, args=training_args(tmp_path, max_steps=3), train_dataset=table)
    trainer.train()
    assert trainer.get_train_dataloader().dataset.column_names == ["x", "labels"]
    reference = make_trainer(model=Strict(), args=training_args(tmp_path / "list", max_steps=3), train_dataset=items)
    reference.train()
    assert losses(trainer) == pytest.approx(losses(reference), rel=1e-6)


@pytest.mark.parametrize("mode", ["all", "non_padding", True])
def test_include_num_input_tokens_seen(tmp_path, mode):
    """'all' counts every position of the padded batches (True means 'all'); 'non_padding' the
    attention_mask ones. The count is cumulative and logged with every entry."""
    items = token_items(8, min_length=2, max_length=9, seed=1)
    trainer = make_trainer(
        model=tiny_llama(),
        args=training_args(tmp_path, num_train_epochs=1, include_num_input_tokens_seen=mode),
        train_dataset=items,
        data_collator=pad_collate,
    )
    trainer.train()
    batches = [pad_collate(items[i : i + 2]) for i in range(0, 8, 2)]
    per_step = [int(b["attention_mask"].sum()) if mode == "non_padding" else b["input_ids"].numel() for b in batches]
    cumulative = [sum(per_step[: k + 1]) for k in range(4)]
    assert losses(trainer, "num_input_tokens_seen") == cumulative
    assert trainer.state.num_input_tokens_seen == cumulative[-1]
    assert cumulative[-1] == (
        sum(len(i["input_ids"]) for i in items)
        if mode == "non_padding"
        else sum(b["input_ids"].numel() for b in batches)
    )


# ---------------------------------------------------------------- reporting, precision, memory


def test_report_to_jsonl_writes_one_line_per_log(tmp_path):
    trainer = make_trainer(
        model=Regression(),
        args=training_args(tmp_path, max_steps=5, logging_steps=2, report_to="jsonl"),
        train_dataset=regression_items(10),
    )
    trainer.train()
    lines = (tmp_path / "log_history.jsonl").read_text().splitlines()
    assert len(lines) == len(trainer.state.log_history) == 3  # steps 2, 4 and the closing metrics (at 5)
    assert [json.loads(line) for line in lines] == trainer.state.log_history


def test_bf16_trains_on_cpu(tmp_path):
    model = Regression()
    trainer = make_trainer(
        model=model, args=training_args(tmp_path, max_steps=4, bf16=True), train_dataset=regression_items(8)
    )
    trainer.train()
    fp32 = make_trainer(
        model=Regression(), args=training_args(tmp_path / "fp32", max_steps=4), train_dataset=regression_items(8)
    )
    fp32.train()
    assert all(math.isfinite(loss) for loss in losses(trainer))
    assert model.linear.weight.dtype == torch.float32  # autocast: the weights stay fp32
    assert losses(trainer) == pytest.approx(losses(fp32), rel=3e-2)
    assert losses(trainer) != losses(fp32)  # bf16 really was used


def test_gradient_checkpointing_gives_the_same_losses(tmp_path, recwarn):
    runs = {}
    for checkpointing in (False, True):
        trainer = make_trainer(
            model=tiny_llama(),
            args=training_args(tmp_path / str(checkpointing), max_steps=3, activation_checkpointing=checkpointing),
            train_dataset=token_items(6),
            data_collator=pad_collate,
        )
        trainer.train()
        assert [layer.gradient_checkpointing for layer in trainer.model.model.layers] == [checkpointing] * 2
        runs[checkpointing] = trainer
    assert losses(runs[True]) == pytest.approx(losses(runs[False]), abs=1e-6)
    assert losses(runs[True], "grad_norm") == pytest.approx(losses(runs[False], "grad_norm"), rel=1e-5)
    assert_weights_close(runs[True].model, runs[False].model, atol=1e-6)
    # transformers 5 deprecates gradient_checkpointing_enable (a FutureWarning); the Trainer uses its new name.
    assert not [w for w in recwarn if "checkpointing_enable" in str(w.message)]


def test_gradient_checkpointing_every_n_layers(tmp_path):
    """every_n_layers is an option of transformers' activation_checkpointing_enable, not of
    torch.utils.checkpoint: with 2, only layer 0 of 2 is checkpointed."""
    trainer = make_trainer(
        model=tiny_llama(),
        args=training_args(
            tmp_path, max_steps=1, activation_checkpointing=True, activation_checkpointing_kwargs={"every_n_layers": 2}
        ),
        train_dataset=token_items(2),
        data_collator=pad_collate,
    )
    trainer.train()
    assert [layer.gradient_checkpointing for layer in trainer.model.model.layers] == [True, False]


class FitsUpTo(Regression):
    """Raises the out-of-memory error a GPU would for batches larger than `limit`."""

    def __init__(self, limit, message="CUDA out of memory. Tried to allocate 2.00 GiB"):
        super().__init__()
        self.limit, self.message = limit, message

    def forward(self, x, labels=None):
        if x.shape[0] > self.limit:
            raise RuntimeError(self.message)
        return super().forward(x, labels)


def test_auto_find_batch_size_shrinks_until_the_batch_fits(tmp_path):
    """8 -> 7 -> 6 -> 5 (x0.9, rounded down): 5 fits. 20 items in batches of 5 are 4 steps."""
    model = FitsUpTo(5)
    trainer = make_trainer(
        model=model,
        args=training_args(tmp_path, per_device_train_batch_size=8, num_train_epochs=1, auto_find_batch_size=True),
        train_dataset=regression_items(20),
    )
    trainer.train()
    assert trainer.state.train_batch_size == 5
    assert trainer.state.global_step == 4
    assert set(model.batch_sizes) == {5}
    assert len(losses(trainer)) == 4 and all(math.isfinite(loss) for loss in losses(trainer))


@pytest.mark.parametrize(
    "options, message",
    [({"auto_find_batch_size": False}, "CUDA out of memory"), ({"auto_find_batch_size": True}, "shape mismatch")],
    ids=["off", "not an out-of-memory error"],
)
def test_auto_find_batch_size_only_retries_out_of_memory(tmp_path, options, message):
    model = FitsUpTo(5, message="CUDA out of memory" if message == "CUDA out of memory" else "shape mismatch")
    trainer = make_trainer(
        model=model,
        args=training_args(tmp_path, per_device_train_batch_size=8, num_train_epochs=1, **options),
        train_dataset=regression_items(20),
    )
    with pytest.raises(RuntimeError, match=message):
        trainer.train()
    assert model.batch_sizes == []


# ---------------------------------------------------------------- bad input


def test_dataset_of_ints_is_a_clear_error(tmp_path):
    trainer = make_trainer(model=Regression(), args=training_args(tmp_path), train_dataset=[1, 2, 3, 4])
    with pytest.raises(TypeError, match=r"Dataset item 0 is a int.*dict"):
        trainer.train()


def test_model_returning_no_loss_is_a_clear_error(tmp_path):
    items = [{"x": item["x"]} for item in regression_items(4)]
    trainer = make_trainer(model=Regression(), args=training_args(tmp_path), train_dataset=items)
    with pytest.raises(
        ValueError, match=r"returned no loss.*\['logits'\].*'labels' were not among its inputs \(\['x'\]\)"
    ):
        trainer.train()


def test_dataset_without_the_labels_a_model_requires(tmp_path):
    items = [{"x": item["x"]} for item in regression_items(4)]
    trainer = make_trainer(model=Strict(), args=training_args(tmp_path), train_dataset=items)
    with pytest.raises(TypeError, match="labels"):
        trainer.train()


def float_label_items(count: int = 4) -> list[dict]:
    """classification_items (for Classifier, whose cross-entropy needs int64 class ids) with float labels."""
    return [{"x": item["x"], "labels": torch.tensor(float(item["labels"]))} for item in classification_items(count)]


@pytest.mark.parametrize("where", ["train", "evaluate", "label smoothing"])
def test_float_labels_for_a_classification_loss_name_labels_and_the_dtype(tmp_path, where):
    options = {"label_smoothing_factor": 0.1} if where == "label smoothing" else {}
    trainer = make_trainer(
        model=Classifier(),
        args=training_args(tmp_path, **options),
        train_dataset=float_label_items(),
        eval_dataset=float_label_items(),
    )
    with pytest.raises(TypeError) as raised:
        trainer.evaluate() if where == "evaluate" else trainer.train()
    message = str(raised.value)
    assert "`labels` of dtype torch.float32 (shape [" in message and "expects torch.int64 (long) class ids" in message
    # The same data with integer labels trains: the check only explains torch's error, it changes nothing.
    for item in trainer.train_dataset:
        item["labels"] = item["labels"].long()
    trainer.train()


@pytest.mark.hf
def test_float_labels_for_a_transformers_classifier_say_they_read_as_multi_label(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        num_labels=3,
    )
    model = transformers.LlamaForSequenceClassification(config)
    items = [{"input_ids": [1, 2, 3], "labels": 1.0}, {"input_ids": [4, 5, 6], "labels": 2.0}]
    trainer = make_trainer(model=model, args=training_args(tmp_path), train_dataset=items)
    with pytest.raises(TypeError, match=r"`labels` of dtype torch.float32 .* multi-label targets"):
        trainer.train()


def test_eval_strategy_without_eval_dataset_fails_at_construction(tmp_path):
    for strategy in ("steps", "epoch"):
        with pytest.raises(ValueError, match=rf"eval_strategy='{strategy}' needs an eval_dataset"):
            make_trainer(
                model=Regression(),
                args=training_args(tmp_path, eval_strategy=strategy),
                train_dataset=regression_items(4),
            )


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(optim="adamw_foo"), r"optim='adamw_foo' is not valid; choose one of \[.*'sgd'"),
        (
            dict(lr_scheduler_type="cosine_foo"),
            r"lr_scheduler_type='cosine_foo' is not valid; choose one of \[.*'cosine'",
        ),
    ],
)
def test_unknown_optimizer_or_schedule_names(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        training_args(tmp_path, **options)


def test_transformers_only_optimizer_fails_before_training(tmp_path):
    """A name transformers knows but lathe does not implement: refused when the optimizer is built,
    before any step, with the list of what is supported."""
    model = Regression()
    trainer = make_trainer(
        model=model, args=training_args(tmp_path, optim="lion_8bit"), train_dataset=regression_items(4)
    )
    with pytest.raises(ValueError, match=r"unsupported optim='lion_8bit'.*'adamw_torch'"):
        trainer.train()
    assert model.forward_calls == 0


@pytest.mark.parametrize(
    "items, options", [([], {}), (regression_items(1), {"dataloader_drop_last": True})], ids=["empty", "all dropped"]
)
def test_empty_train_dataset_is_a_clear_error(tmp_path, items, options):
    trainer = make_trainer(model=Regression(), args=training_args(tmp_path, **options), train_dataset=items)
    with pytest.raises(ValueError, match="training dataloader is empty"):
        trainer.train()


@pytest.mark.parametrize("library", ["lathe", pytest.param("hf", marks=pytest.mark.hf)])
def test_num_examples_counts_the_dataset_or_estimates_from_batches(tmp_path, library):
    if library == "hf":
        pytest.importorskip("transformers")
    trainer = make_trainer(
        library,
        model=Regression(),
        args=training_args(tmp_path, library, per_device_train_batch_size=4),
        train_dataset=regression_items(10),
    )
    assert trainer.num_examples(trainer.get_train_dataloader()) == 10  # the dataset's length, not 3 batches x 4

    class Batches:  # a loader whose dataset has no length: len(loader) x per-device batch size
        dataset = Stream(regression_items(6))

        def __len__(self):
            return 2

    assert trainer.num_examples(Batches()) == 8
