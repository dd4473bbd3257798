"""Tests for the Trainer's documented override points (each one, overridden in a subclass, is called
and its result is used), callback management (add / pop / remove), and what save_model,
save_metrics and save_state write."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader

from lathe.train import (
    DefaultFlowCallback,
    EvalLoopOutput,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainerState,
    TrainingArguments,
)


class Regressor(nn.Module):
    """logits = x·w, mean-squared-error loss, a transformers-style dict output."""

    def __init__(self, features: int = 1):
        super().__init__()
        self.linear = nn.Linear(features, 1, bias=False)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x, labels=None):
        logits = self.linear(x).squeeze(-1)
        if labels is None:
            return {"logits": logits}
        return {"loss": F.mse_loss(logits, labels), "logits": logits}


def constant_data(n: int, target: float, features: int = 1):
    """n copies of x = 1 with one target: SGD on (w - target)^2 then has a closed form."""
    return [{"x": torch.ones(features), "labels": torch.tensor(target)} for _ in range(n)]


def make_trainer(tmp_path, trainer_class=Trainer, model=None, **args):
    """Plain SGD with a constant learning rate and no clipping, so weights follow by hand:
    on loss (w - 2)^2 from w = 0 with lr 0.1, w_t = 2 - 2 * 0.8^t."""
    options = dict(
        output_dir=str(tmp_path / "out"),
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        per_device_train_batch_size=1,
        per_device_eval_batch_size=4,
        optim="sgd",
        learning_rate=0.1,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        max_steps=3,
        save_strategy="no",
    )
    options.update(args)
    trainer_kwargs = {
        k: options.pop(k)
        for k in ("train_dataset", "eval_dataset", "compute_metrics", "callbacks", "processing_class")
        if k in options
    }
    trainer_kwargs.setdefault("train_dataset", constant_data(6, target=2.0))
    return trainer_class(model=model or Regressor(), args=TrainingArguments(**options), **trainer_kwargs)


def weight(trainer) -> torch.Tensor:
    return trainer.model.linear.weight.detach().flatten()


def logged(trainer, key: str) -> list:
    return [(log["step"], log[key]) for log in trainer.state.log_history if key in log]


# ----- override points -----


class SquaredWeightsLoss(Trainer):
    """Replaces the model's loss with sum(w^2): SGD then shrinks w by (1 - 2 lr) per step."""

    calls = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.calls += 1
        outputs = model(**inputs)
        loss = (model.linear.weight**2).sum()
        return (loss, outputs) if return_outputs else loss


def test_compute_loss_override_changes_training_and_eval_loss(tmp_path):
    model = Regressor(features=2)
    with torch.no_grad():
        model.linear.weight.copy_(torch.tensor([[1.0, -2.0]]))
    trainer = make_trainer(
        tmp_path,
        SquaredWeightsLoss,
        model=model,
        train_dataset=constant_data(6, 2.0, features=2),
        eval_dataset=constant_data(5, 0.0, features=2),
    )
    trainer.train()
    # w <- w - 0.1 * 2w = 0.8 w, three times.
    assert weight(trainer).tolist() == pytest.approx([0.512, -1.024], abs=1e-6)
    assert trainer.state.log_history[-1]["train_loss"] == pytest.approx((1 + 4) * (1 + 0.64 + 0.64**2) / 3, abs=1e-5)
    calls_in_training = trainer.calls
    assert calls_in_training == 3
    # Evaluation reports the custom loss too (prediction_step asks compute_loss, return_outputs=True).
    assert trainer.evaluate()["eval_loss"] == pytest.approx(0.512**2 + 1.024**2, abs=1e-6)
    assert trainer.calls == calls_in_training + 2  # 5 eval samples in batches of 4


class ForwardOnlyStep(Trainer):
    """A training_step that never calls backward and reports a made-up loss."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.batches = getattr(self, "batches", []) + [inputs["x"].shape[0]]
        return torch.tensor(7.0)


def test_training_step_override_is_called_for_each_micro_batch_and_its_loss_logged(tmp_path):
    trainer = make_trainer(tmp_path, ForwardOnlyStep, gradient_accumulation_steps=2, logging_steps=1)
    output = trainer.train()
    assert trainer.batches == [1] * 6  # 3 updates x 2 micro-batches
    assert weight(trainer).tolist() == [0.0]  # no backward: no gradient, no change
    assert [loss for _, loss in logged(trainer, "loss")] == [14.0, 14.0, 14.0]  # summed over the window
    assert output.training_loss == pytest.approx(14.0)


class ConstantPredictions(Trainer):
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        size = inputs["x"].shape[0]
        labels = inputs.get("labels")
        return torch.tensor(3.0), torch.full((size,), 5.0), labels


def test_prediction_step_override_feeds_loss_metrics_and_predictions(tmp_path):
    seen = []

    def compute_metrics(eval_pred):
        seen.append(eval_pred.predictions)
        return {"mean_prediction": float(eval_pred.predictions.mean())}

    data = constant_data(10, 1.0)
    trainer = make_trainer(tmp_path, ConstantPredictions, eval_dataset=data, compute_metrics=compute_metrics)
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == 3.0 and metrics["eval_mean_prediction"] == 5.0
    np.testing.assert_array_equal(seen[0], np.full(10, 5.0, dtype=np.float32))
    output = trainer.predict(data)
    np.testing.assert_array_equal(output.predictions, np.full(10, 5.0, dtype=np.float32))
    assert output.metrics["test_loss"] == 3.0


class ScriptedEvaluate(Trainer):
    """evaluate() adds a made-up metric: the best model must follow it."""

    scores = [0.1, 0.9, 0.3, 0.2]

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        self.calls = getattr(self, "calls", []) + [(self.state.global_step, ignore_keys)]
        metrics[f"{metric_key_prefix}_custom"] = self.scores[len(self.calls) - 1]
        return metrics


def test_evaluate_override_is_used_during_training(tmp_path):
    trainer = make_trainer(
        tmp_path,
        ScriptedEvaluate,
        max_steps=4,
        eval_dataset=constant_data(2, 1.0),
        eval_strategy="steps",
        eval_steps=1,
        metric_for_best_model="custom",
    )
    trainer.train(ignore_keys_for_eval=["hidden"])
    assert trainer.calls == [(1, ["hidden"]), (2, ["hidden"]), (3, ["hidden"]), (4, ["hidden"])]
    assert (trainer.state.best_global_step, trainer.state.best_metric) == (2, 0.9)


class FixedLoop(Trainer):
    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        self.descriptions = getattr(self, "descriptions", []) + [description]
        return EvalLoopOutput(
            predictions=np.zeros(3),
            label_ids=np.ones(3),
            metrics={f"{metric_key_prefix}_loss": 42.0},
            num_samples=3,
        )


def test_evaluation_loop_override_feeds_evaluate_and_predict(tmp_path):
    data = constant_data(10, 1.0)
    trainer = make_trainer(tmp_path, FixedLoop, eval_dataset=data)
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == 42.0
    # Speed metrics count the loop's num_samples: 3 samples, ceil(3 / 4) = 1 batch.
    assert metrics["eval_samples_per_second"] / metrics["eval_steps_per_second"] == pytest.approx(3, rel=1e-3)
    output = trainer.predict(data)
    np.testing.assert_array_equal(output.predictions, np.zeros(3))
    np.testing.assert_array_equal(output.label_ids, np.ones(3))
    assert output.metrics["test_loss"] == 42.0
    assert trainer.descriptions == ["Evaluation", "Prediction"]


class FastSGD(Trainer):
    """Its own optimizer: SGD at lr 0.25 whatever args.learning_rate says."""

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.25)
            self.created = self.optimizer
        return self.optimizer


def test_create_optimizer_override_is_used(tmp_path):
    trainer = make_trainer(tmp_path, FastSGD, learning_rate=1e-3, logging_steps=1)
    trainer.train()
    assert trainer.optimizer is trainer.created
    # w <- w - 0.25 * 2 (w - 2): 1, 1.5, 1.75 (with lr 1e-3 it would barely move).
    assert weight(trainer).item() == pytest.approx(1.75, abs=1e-6)
    assert [lr for _, lr in logged(trainer, "learning_rate")] == [0.25, 0.25, 0.25]
    assert trainer.lr_scheduler.optimizer is trainer.created  # the scheduler drives the custom optimizer


class HalvingSchedule(Trainer):
    def create_scheduler(self, num_training_steps, optimizer=None):
        self.requested_steps = num_training_steps
        if self.lr_scheduler is None:
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, lambda step: 0.5**step)
        return self.lr_scheduler


def test_create_scheduler_override_is_used(tmp_path):
    trainer = make_trainer(tmp_path, HalvingSchedule, learning_rate=0.4, logging_steps=1)
    trainer.train()
    assert trainer.requested_steps == 3
    assert [lr for _, lr in logged(trainer, "learning_rate")] == pytest.approx([0.4, 0.2, 0.1])
    # w1 = 0 + 0.4 * 4 = 1.6; w2 = 1.6 + 0.2 * 0.8 = 1.76; w3 = 1.76 + 0.1 * 0.48 = 1.808.
    assert weight(trainer).item() == pytest.approx(1.808, abs=1e-6)


class OwnLoaders(Trainer):
    """Dataloaders over their own data (target 2 for training, 1 for eval, 3 samples for test)."""

    def get_train_dataloader(self):
        self.loader_calls = getattr(self, "loader_calls", []) + ["train"]
        return DataLoader(constant_data(3, 2.0), batch_size=1)

    def get_eval_dataloader(self, eval_dataset=None):
        self.loader_calls = getattr(self, "loader_calls", []) + [("eval", eval_dataset)]
        return DataLoader(constant_data(4, 1.0), batch_size=4)

    def get_test_dataloader(self, test_dataset):
        self.loader_calls = getattr(self, "loader_calls", []) + [("test", test_dataset)]
        return DataLoader(constant_data(3, 1.0), batch_size=2)


def test_get_train_dataloader_override_is_used(tmp_path):
    # The train_dataset (10 samples, target 100) would mean 10 steps towards 100.
    trainer = make_trainer(
        tmp_path, OwnLoaders, train_dataset=constant_data(10, 100.0), max_steps=-1, num_train_epochs=1
    )
    output = trainer.train()
    assert trainer.loader_calls == ["train"]
    assert output.global_step == 3
    assert weight(trainer).item() == pytest.approx(2 - 2 * 0.8**3, abs=1e-6)


def test_get_eval_and_test_dataloader_overrides_are_used(tmp_path):
    other = constant_data(5, 9.0)
    trainer = make_trainer(tmp_path, OwnLoaders, eval_dataset=other)
    assert trainer.evaluate()["eval_loss"] == 1.0  # (0 - 1)^2 on the override's data, not (0 - 9)^2
    assert trainer.evaluate(other)["eval_loss"] == 1.0
    output = trainer.predict(other)
    assert output.predictions.shape == (3,) and output.label_ids.tolist() == [1.0, 1.0, 1.0]
    assert trainer.loader_calls == [("eval", None), ("eval", other), ("test", other)]


def test_get_eval_dataloader_override_is_used_during_training(tmp_path):
    trainer = make_trainer(
        tmp_path, OwnLoaders, eval_strategy="steps", eval_steps=1, eval_dataset=constant_data(5, 9.0)
    )
    trainer.train()
    assert trainer.loader_calls == ["train", ("eval", None), ("eval", None), ("eval", None)]
    assert [loss for _, loss in logged(trainer, "eval_loss")] == pytest.approx(
        [(2 - 2 * 0.8**t - 1) ** 2 for t in (1, 2, 3)], abs=1e-6
    )


class TaggedLog(Trainer):
    """log() sees every log dict and adds a key, which must reach log_history and the callbacks."""

    def log(self, logs, start_time=None):
        self.seen = getattr(self, "seen", []) + [sorted(logs)]
        logs["tag"] = len(self.seen)
        super().log(logs, start_time)


class RecordLogs(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def test_log_override_sees_every_log(tmp_path):
    recorder = RecordLogs()
    trainer = make_trainer(
        tmp_path,
        TaggedLog,
        max_steps=4,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        eval_dataset=constant_data(2, 1.0),
        callbacks=[recorder],
    )
    trainer.train()
    trainer.evaluate()
    history = trainer.state.log_history
    # 4 loss logs, evaluations at steps 2 and 4, the train summary, then the explicit evaluate().
    assert len(trainer.seen) == len(history) == len(recorder.logs) == 8
    assert [log["tag"] for log in history] == list(range(1, 9))
    assert [log["tag"] for log in recorder.logs] == list(range(1, 9))
    kinds = ["loss" if "loss" in keys else "eval" if "eval_loss" in keys else "train" for keys in trainer.seen]
    assert kinds == ["loss", "loss", "eval", "loss", "loss", "eval", "train", "eval"]
    assert [log["step"] for log in history] == [1, 2, 2, 3, 4, 4, 4, 4]


# ----- callbacks -----


class Counting(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


class OtherCounting(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def callback_types(trainer) -> list:
    return [type(cb) for cb in trainer.callback_handler.callbacks]


def test_add_pop_remove_callbacks_by_class_and_instance(tmp_path):
    first = Counting()
    trainer = make_trainer(tmp_path, callbacks=[first])
    assert callback_types(trainer) == [DefaultFlowCallback, PrinterCallback, Counting]
    trainer.add_callback(OtherCounting)  # a class is instantiated
    second = Counting()
    trainer.add_callback(second)
    assert callback_types(trainer) == [DefaultFlowCallback, PrinterCallback, Counting, OtherCounting, Counting]

    assert trainer.pop_callback(second) is second  # by instance: that one
    assert trainer.pop_callback(Counting) is first  # by class: the first match
    assert trainer.pop_callback(Counting) is None
    assert callback_types(trainer) == [DefaultFlowCallback, PrinterCallback, OtherCounting]

    kept, removed = Counting(), Counting()
    trainer.add_callback(kept)
    trainer.add_callback(removed)
    trainer.remove_callback(removed)
    trainer.remove_callback(PrinterCallback)
    assert callback_types(trainer) == [DefaultFlowCallback, OtherCounting, Counting]
    assert trainer.callback_handler.callbacks[2] is kept

    trainer.train()
    assert kept.steps == 3 and removed.steps == 0 and first.steps == 0 and second.steps == 0
    assert trainer.callback_handler.callbacks[1].steps == 3  # the OtherCounting added by class


# ----- what save_model, save_metrics and save_state write -----


def test_save_model_of_a_plain_module_writes_loadable_safetensors(tmp_path):
    model = Regressor(features=3)
    with torch.no_grad():
        model.linear.weight.copy_(torch.tensor([[0.5, -1.5, 2.5]]))
    trainer = make_trainer(tmp_path, model=model)
    trainer.save_model(str(tmp_path / "saved"))
    files = set(os.listdir(tmp_path / "saved"))
    assert {"model.safetensors", "training_args.bin"} <= files
    fresh = Regressor(features=3)
    fresh.load_state_dict(load_file(str(tmp_path / "saved" / "model.safetensors")))  # strict: same keys
    assert torch.equal(fresh.linear.weight, model.linear.weight)
    trainer.save_model()  # default: output_dir
    assert os.path.isfile(os.path.join(trainer.args.output_dir, "model.safetensors"))


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def word_level_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "world": 3, "lathe": 4}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]")


@pytest.mark.hf
def test_save_model_of_a_transformers_model_and_its_tokenizer(tmp_path):
    import transformers

    model = tiny_llama()
    trainer = make_trainer(tmp_path, model=model, processing_class=word_level_tokenizer())
    folder = str(tmp_path / "saved")
    trainer.save_model(folder)
    files = set(os.listdir(folder))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    reloaded = transformers.LlamaForCausalLM.from_pretrained(folder)
    ours, theirs = model.state_dict(), reloaded.state_dict()
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    assert tokenizer("hello lathe world")["input_ids"] == [2, 4, 3]
    assert tokenizer.pad_token == "[PAD]" and tokenizer.pad_token_id == 0


def test_save_metrics_writes_split_and_combined_results(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.save_metrics("train", {"train_loss": 0.5, "epoch": 1.0})
    trainer.save_metrics("eval", {"eval_loss": 0.25, "epoch": 2.0})
    trainer.save_metrics("test", {"test_loss": 0.125}, combined=False)
    out = tmp_path / "out"

    def read(name):
        with open(out / name, encoding="utf-8") as f:
            return json.load(f)

    assert read("train_results.json") == {"train_loss": 0.5, "epoch": 1.0}
    assert read("eval_results.json") == {"eval_loss": 0.25, "epoch": 2.0}
    assert read("test_results.json") == {"test_loss": 0.125}
    assert read("all_results.json") == {"train_loss": 0.5, "eval_loss": 0.25, "epoch": 2.0}  # later splits win


@pytest.mark.hf
def test_save_metrics_files_match_transformers(tmp_path):
    import transformers

    ours = make_trainer(tmp_path)
    theirs = transformers.Trainer(
        model=Regressor(),
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none", use_cpu=True),
    )
    for trainer in (ours, theirs):
        trainer.save_metrics("train", {"train_loss": 0.5, "b": 1, "a": [1, 2]})
        trainer.save_metrics("eval", {"eval_loss": 0.25})
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        with open(tmp_path / "out" / name, encoding="utf-8") as f, open(tmp_path / "hf" / name, encoding="utf-8") as g:
            assert f.read() == g.read(), name


def test_save_state_writes_sorted_indented_trainer_state(tmp_path):
    trainer = make_trainer(tmp_path, logging_steps=1)
    trainer.train()
    trainer.save_state()
    path = tmp_path / "out" / "trainer_state.json"
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert list(data) == sorted(data) and text.startswith('{\n  "best_global_step"')
    assert data["global_step"] == 3 and data["max_steps"] == 3
    assert [log["step"] for log in data["log_history"]] == [1, 2, 3, 3]
    assert TrainerState.load_from_json(str(path)) == trainer.state


@pytest.mark.hf
def test_trainer_state_json_has_the_keys_transformers_writes(tmp_path):
    import transformers

    trainer = make_trainer(tmp_path)
    trainer.train()
    trainer.save_state()
    path = str(tmp_path / "out" / "trainer_state.json")
    with open(path, encoding="utf-8") as f:
        ours = json.load(f)
    theirs = json.loads(json.dumps(dataclasses.asdict(transformers.TrainerState())))
    assert set(ours) == set(theirs)
    loaded = transformers.TrainerState.load_from_json(path)  # transformers reads lathe's file
    assert loaded.global_step == 3 and loaded.log_history == ours["log_history"]
