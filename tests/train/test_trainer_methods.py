"""transformers' public Trainer methods beyond the loop (issue 17, point 5): what they return, compared with
transformers.Trainer on the same job where it is installed (the `hf` marker)."""

from __future__ import annotations

import contextlib
import os
import types

import pytest
import torch

from tests.train.trainer_helpers import (
    Regression,
    library_module,
    make_trainer,
    pad_collate,
    regression_items,
    tiny_llama,
    token_items,
    training_args,
)

BOTH = ["lathe", pytest.param("transformers", marks=pytest.mark.hf)]


def regression_trainer(library, output_dir, model=None, **overrides):
    args = training_args(output_dir, library, **overrides)
    return make_trainer(library, model=model or Regression(), args=args, train_dataset=regression_items(12))


@pytest.mark.parametrize("library", BOTH)
def test_trainable_parameters_learning_rates_and_groups(tmp_path, library):
    model = Regression()
    model.linear.bias.requires_grad_(False)
    trainer = regression_trainer(library, tmp_path, model, optim="adamw_torch", weight_decay=0.1, learning_rate=0.01)
    assert trainer.get_num_trainable_parameters() == 3  # the 3 weights; the frozen bias does not count
    for method in (trainer.get_learning_rates, trainer.get_optimizer_group):
        with pytest.raises(ValueError, match="optimizer is None"):
            method()
    trainer.create_optimizer()
    assert trainer.get_learning_rates() == [0.01] * len(trainer.optimizer.param_groups)
    group = trainer.get_optimizer_group(model.linear.weight)
    assert any(p is model.linear.weight for p in group["params"]) and group["weight_decay"] == 0.1
    every_group = trainer.get_optimizer_group()
    assert [len(params) for params in every_group] == [len(g["params"]) for g in trainer.optimizer.param_groups]
    assert trainer.get_optimizer_group("linear.weight") == every_group  # a name is not a parameter: every group


@pytest.mark.hf
@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_torch_fused", "sgd", "adafactor"])
def test_get_optimizer_cls_and_kwargs_is_static_and_equals_transformers(tmp_path, optim):
    from lathe import Trainer

    transformers = pytest.importorskip("transformers")
    ours = Trainer.get_optimizer_cls_and_kwargs(training_args(tmp_path, optim=optim, optim_args=None))
    theirs = transformers.Trainer.get_optimizer_cls_and_kwargs(
        training_args(tmp_path, "transformers", optim=optim, optim_args=None)
    )
    assert ours[0].__name__ == theirs[0].__name__
    assert ours[1] == theirs[1]


@pytest.mark.parametrize("library", BOTH)
def test_batch_sizes_initial_values_and_parallel_sizes(tmp_path, library):
    trainer = regression_trainer(library, tmp_path, gradient_accumulation_steps=3, num_train_epochs=2)
    assert trainer.get_total_train_batch_size(trainer.args) == 6
    assert (trainer.get_tp_size(), trainer.get_cp_size(), trainer.get_sp_size()) == (1, 1, 1)
    loader = trainer.get_train_dataloader()
    # 12 examples in 6 batches of 2, 2 updates of 3 batches per epoch, 2 epochs
    assert trainer.set_initial_training_values(trainer.args, loader) == (2, 2, 12, 24, 6, 6, 4)
    trainer.args.max_steps = 5
    assert trainer.set_initial_training_values(trainer.args, loader) == (3, 2, 12, 30, 6, 6, 5)
    assert trainer.is_deepspeed_enabled is False and trainer.is_fsdp_enabled is False
    assert trainer.is_model_parallel is False and trainer.place_model_on_device is True


@pytest.mark.parametrize("library", BOTH)
def test_get_batch_samples_counts_label_tokens_of_the_whole_window(tmp_path, library):
    model = tiny_llama()
    args = training_args(tmp_path, library, per_device_train_batch_size=3)
    trainer = make_trainer(library, model=model, args=args, train_dataset=token_items(6), data_collator=pad_collate)
    trainer.current_gradient_accumulation_steps = 2
    batches, num_items = trainer.get_batch_samples(iter(trainer.get_train_dataloader()), 5, torch.device("cpu"))
    assert len(batches) == 2  # only two batches exist
    expected = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)  # causal LM: the first label never counts
    assert int(num_items) == expected
    regression = regression_trainer(library, tmp_path)
    _, none = regression.get_batch_samples(iter(regression.get_train_dataloader()), 2, torch.device("cpu"))
    assert none is None  # the model divides by its own batch: no count


@pytest.mark.parametrize("library", BOTH)
def test_compute_loss_context_manager_wraps_every_loss(tmp_path, library):
    entered = []

    @contextlib.contextmanager
    def recording():
        entered.append("forward")
        yield

    class Recording(library_module(library).Trainer):
        def autocast_smart_context_manager(self, cache_enabled=True):
            return recording()

    args = training_args(tmp_path, library, max_steps=2, gradient_accumulation_steps=2, per_device_eval_batch_size=2)
    trainer = Recording(
        model=Regression(), args=args, train_dataset=regression_items(12), eval_dataset=regression_items(4)
    )
    assert isinstance(library_module(library).Trainer.autocast_smart_context_manager(trainer), contextlib.nullcontext)
    trainer.train()
    assert len(entered) == 4  # 2 updates x 2 micro-batches
    trainer.evaluate()
    assert len(entered) == 6  # + 2 evaluation batches of 2


def test_loss_is_scaled_for_ga_skips_the_division_by_the_window(tmp_path):
    """A subclass saying its loss is already scaled: each micro-batch loss is used as is (twice the step here)."""
    from lathe import Trainer

    class Scaled(Trainer):
        loss_is_scaled_for_ga = True

    def first_step_change(trainer_cls):
        model = Regression()
        before = model.linear.weight.detach().clone()
        args = training_args(
            tmp_path / trainer_cls.__name__, max_steps=1, gradient_accumulation_steps=2, max_grad_norm=0
        )
        trainer_cls(model=model, args=args, train_dataset=regression_items(4)).train()
        return model.linear.weight.detach() - before

    torch.testing.assert_close(first_step_change(Scaled), 2 * first_step_change(Trainer), rtol=1e-6, atol=1e-7)


def test_push_to_hub_and_init_hf_repo_are_offline_errors(tmp_path):
    trainer = regression_trainer("lathe", tmp_path)
    for method in (trainer.push_to_hub, trainer.init_hf_repo):
        with pytest.raises(NotImplementedError, match="offline"):
            method()


def _card_body(text: str) -> str:
    """A model card without its framework versions (lathe names itself, transformers itself)."""
    return text.split("### Framework versions")[0]


@pytest.mark.hf
def test_create_model_card_writes_transformers_readme(tmp_path):
    cards = {}
    for library in ("lathe", "transformers"):
        output = tmp_path / library / "tiny-regressor"
        args = training_args(output, library, max_steps=4, eval_strategy="steps", eval_steps=2, logging_steps=2)
        model = Regression()
        model.config = types.SimpleNamespace(_name_or_path="tiny/base-regressor")  # what the card names as base
        trainer = make_trainer(
            library, model=model, args=args, train_dataset=regression_items(12), eval_dataset=regression_items(4)
        )
        trainer.train()
        trainer.create_model_card(language="en", license="mit", tags="regression", dataset="toy points")
        cards[library] = (output / "README.md").read_text()
    assert "# tiny-regressor" in cards["lathe"] and "### Training results" in cards["lathe"]
    assert "- learning_rate: 0.1" in cards["lathe"] and "Validation Loss" in cards["lathe"]
    # The same job gives the same numbers, so the cards are equal text above the framework versions.
    assert _card_body(cards["lathe"]) == _card_body(cards["transformers"])


@pytest.mark.hf
def test_seq2seq_generation_config_from_arguments(tmp_path):
    transformers = pytest.importorskip("transformers")
    from lathe import Seq2SeqTrainer, Seq2SeqTrainingArguments

    folder = tmp_path / "generation"
    transformers.GenerationConfig(max_length=7, num_beams=2).save_pretrained(folder)
    model = tiny_llama()
    for source in (folder, folder / "generation_config.json", transformers.GenerationConfig(max_length=7, num_beams=2)):
        args = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", generation_config=source)
        trainer = Seq2SeqTrainer(model=model, args=args)
        assert (model.generation_config.max_length, model.generation_config.num_beams) == (7, 2)
        assert trainer.load_generation_config(source).to_dict() == model.generation_config.to_dict()
    with pytest.raises(ValueError, match="offline"):
        Seq2SeqTrainer.load_generation_config(str(tmp_path / "missing"))


def search_trainer(library, output_dir):
    args = training_args(
        output_dir, library, max_steps=4, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2
    )
    return make_trainer(
        library,
        model_init=lambda: Regression(),
        args=args,
        train_dataset=regression_items(12),
        eval_dataset=regression_items(6, seed=1),
    )


def hp_space(trial):
    return {"learning_rate": trial.suggest_categorical("learning_rate", [0.01, 0.05, 0.2])}


@pytest.mark.slow
@pytest.mark.parametrize("library", BOTH)
def test_hyperparameter_search_with_optuna(tmp_path, library):
    optuna = pytest.importorskip("optuna")
    trainer = search_trainer(library, tmp_path)
    best = trainer.hyperparameter_search(
        hp_space=hp_space, n_trials=3, direction="minimize", sampler=optuna.samplers.RandomSampler(seed=0)
    )
    assert type(best).__name__ == "BestRun" and best.run_id in {"0", "1", "2"}
    assert set(best.hyperparameters) == {"learning_rate"}
    assert sorted(os.listdir(tmp_path)) == ["run-0", "run-1", "run-2"]
    assert sorted(os.listdir(tmp_path / "run-0")) == ["checkpoint-2", "checkpoint-4"]
    assert trainer.hp_search_backend is None
    # The objective is the best trial's last eval_loss; train it again with that rate to check.
    again = search_trainer(library, tmp_path / "again")
    again.args.learning_rate = best.hyperparameters["learning_rate"]
    again.train()
    assert best.objective == pytest.approx(again.evaluate()["eval_loss"], rel=1e-6)


@pytest.mark.slow
@pytest.mark.hf
def test_hyperparameter_search_equals_transformers(tmp_path):
    optuna = pytest.importorskip("optuna")
    results = {}
    for library in ("lathe", "transformers"):
        trainer = search_trainer(library, tmp_path / library)
        results[library] = trainer.hyperparameter_search(
            hp_space=hp_space,
            n_trials=3,
            hp_name=lambda trial: f"trial-{trial.number}",
            sampler=optuna.samplers.RandomSampler(seed=0),
        )
        assert sorted(os.listdir(tmp_path / library)) == ["trial-0", "trial-1", "trial-2"]
    ours, theirs = results["lathe"], results["transformers"]
    assert (ours.run_id, ours.hyperparameters) == (theirs.run_id, theirs.hyperparameters)
    assert ours.objective == pytest.approx(theirs.objective, rel=1e-5)


def test_hyperparameter_search_errors(tmp_path, monkeypatch):
    pytest.importorskip("optuna")
    with pytest.raises(RuntimeError, match="model_init"):
        regression_trainer("lathe", tmp_path).hyperparameter_search(n_trials=1)
    with pytest.raises(NotImplementedError, match="optuna"):
        search_trainer("lathe", tmp_path).hyperparameter_search(n_trials=1, backend="ray")
    with pytest.raises(ValueError):
        search_trainer("lathe", tmp_path).hyperparameter_search(n_trials=1, backend="nevergrad")
    monkeypatch.setitem(__import__("sys").modules, "optuna", None)
    with pytest.raises(ImportError, match=r"pip install 'lathe\[optuna\]'"):
        search_trainer("lathe", tmp_path).hyperparameter_search(n_trials=1)


def test_trial_name_and_params_in_the_state(tmp_path):
    optuna = pytest.importorskip("optuna")
    trainer = search_trainer("lathe", tmp_path)
    trainer.hyperparameter_search(
        hp_space=hp_space,
        compute_objective=lambda metrics: metrics["eval_loss"],
        n_trials=1,
        hp_name=lambda trial: f"named-{trial.number}",
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    assert trainer.state.trial_name == "named-0"
    assert set(trainer.state.trial_params) == {"learning_rate"}
    assert trainer.args.output_dir == str(tmp_path)  # restored after the trial
    assert os.path.isdir(tmp_path / "named-0" / "checkpoint-4")


@pytest.mark.hf
@pytest.mark.parametrize("name", ["Trainer", "Seq2SeqTrainer"])
def test_every_public_method_of_transformers_trainer_exists(name):
    transformers = pytest.importorskip("transformers")
    import lathe

    theirs, ours = getattr(transformers, name), getattr(lathe, name)
    missing = [n for n in dir(theirs) if not n.startswith("_") and not hasattr(ours, n)]
    assert not missing, f"lathe.{name} lacks transformers' {missing}"
    assert not hasattr(ours.get_optimizer_cls_and_kwargs, "__self__")  # a staticmethod, callable on the class


def test_gather_function(tmp_path, monkeypatch):
    from lathe.train.parallel import distributed

    trainer = regression_trainer("lathe", tmp_path)
    batch = {"logits": torch.ones(2, 3)}
    assert trainer.gather_function(batch) is batch  # one process: unchanged, as accelerate's gather_for_metrics
    ranks = [{"logits": torch.full((2, 3), float(rank)), "loss": torch.tensor(float(rank))} for rank in range(2)]
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed, "gather_objects", lambda value: ranks)
    gathered = trainer.gather_function(ranks[0])
    assert gathered["logits"].tolist() == [[0.0] * 3] * 2 + [[1.0] * 3] * 2 and gathered["loss"].tolist() == [0.0, 1.0]
    assert trainer.gather_function(ranks[0], use_gather_object=True) == ranks
