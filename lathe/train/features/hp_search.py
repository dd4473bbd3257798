"""Hyperparameter search (Trainer.hyperparameter_search) with optuna, as transformers runs it: each trial
re-creates the model through model_init, applies the trial's hyperparameters to the arguments, trains
with its checkpoints in output_dir/run-<trial number> (or hp_name(trial)), and reports the objective
after each evaluation (optuna may prune). The one module that imports optuna."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from typing import Any, NamedTuple

from lathe.train.args.enums import ExplicitEnum

logger = logging.getLogger("lathe.train.trainer")

_INSTALL_HINT = "hyperparameter_search needs optuna: pip install 'lathe[optuna]' (or pip install optuna)"


class HPSearchBackend(ExplicitEnum):
    OPTUNA = "optuna"
    RAY = "ray"
    WANDB = "wandb"


class BestRun(NamedTuple):
    """The best trial: its id (checkpoints in output_dir/run-<run_id>), objective and hyperparameters."""

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any | None = None


def default_compute_objective(metrics: dict[str, float]) -> float:
    """eval_loss when evaluation returned no other metric, else the sum of the other metrics (speed
    metrics and epoch left out), as in transformers."""
    metrics = copy.deepcopy(metrics)
    loss = metrics.pop("eval_loss", None)
    metrics.pop("epoch", None)
    for name in [m for m in metrics if m.endswith("_runtime") or m.endswith("_per_second")]:
        metrics.pop(name)
    return loss if len(metrics) == 0 else sum(metrics.values())


def default_hp_space_optuna(trial) -> dict[str, float]:
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [4, 8, 16, 32, 64]),
    }


def import_optuna():
    try:
        import optuna
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    return optuna


def hyperparameter_search(
    trainer,
    hp_space=None,
    compute_objective=None,
    n_trials: int = 20,
    direction: str | list[str] = "minimize",
    backend: str | HPSearchBackend | None = None,
    hp_name=None,
    **kwargs,
) -> BestRun | list[BestRun]:
    """Run `n_trials` trainings chosen by optuna and return the best (a list of the Pareto-best runs when
    `direction` is a list). kwargs go to optuna.create_study, except timeout, n_jobs, gc_after_trial and
    catch, which go to study.optimize."""
    backend = HPSearchBackend(backend if backend is not None else HPSearchBackend.OPTUNA)
    if backend is not HPSearchBackend.OPTUNA:
        raise NotImplementedError(f"hyperparameter_search(backend={backend.value!r}): lathe supports 'optuna' only.")
    optuna = import_optuna()
    if trainer.model_init is None:
        raise RuntimeError("To use hyperparameter search, you need to pass your model through a model_init function.")
    if trainer.args.world_size > 1:
        raise NotImplementedError("hyperparameter_search runs in one process in lathe; launch it without torchrun.")
    trainer.hp_search_backend = backend
    trainer.hp_space = default_hp_space_optuna if hp_space is None else hp_space
    trainer.hp_name = hp_name
    trainer.compute_objective = default_compute_objective if compute_objective is None else compute_objective
    try:
        return _run_optuna(trainer, optuna, n_trials, direction, kwargs)
    finally:
        trainer.hp_search_backend = None


def _run_optuna(trainer, optuna, n_trials: int, direction, kwargs: dict):
    optimize = {key: kwargs.pop(key) for key in ("timeout", "n_jobs", "gc_after_trial", "catch") if key in kwargs}
    directions = direction if isinstance(direction, list) else None
    study = optuna.create_study(direction=None if directions else direction, directions=directions, **kwargs)

    def objective(trial):
        trainer.objective = None
        trainer.train(trial=trial)
        if trainer.objective is None:  # no evaluation during training: evaluate once now
            trainer.objective = trainer.compute_objective(trainer.evaluate())
        return trainer.objective

    study.optimize(objective, n_trials=n_trials, **optimize)
    if directions is None:
        best = study.best_trial
        return BestRun(str(best.number), best.value, best.params)
    return [BestRun(str(best.number), best.values, best.params) for best in study.best_trials]


def apply_trial(trainer, trial) -> None:
    """The trial's hyperparameters (hp_space(trial)) set on the arguments, each cast to the field's current
    type; unknown names are warned about and skipped, as in transformers."""
    trainer._trial = trial
    if trainer.hp_search_backend is None or trial is None:
        return
    for key, value in trainer.hp_space(trial).items():
        if not hasattr(trainer.args, key):
            logger.warning(
                "Trying to set %s in the hyperparameter search but there is no corresponding field in "
                "`TrainingArguments`.",
                key,
            )
            continue
        current = getattr(trainer.args, key)
        setattr(trainer.args, key, type(current)(value) if current is not None else value)
    logger.info("Trial: %s", trial.params)
    trainer._train_batch_size = trainer.args.train_batch_size


def trial_name(trainer, trial) -> str | None:
    """The folder of a trial's checkpoints under output_dir: hp_name(trial), or run-<trial number>."""
    if trainer.hp_search_backend is None or trial is None:
        return None
    return trainer.hp_name(trial) if trainer.hp_name is not None else f"run-{trial.number}"


@contextlib.contextmanager
def trial_output_dir(trainer, trial):
    """During a search trial, checkpoints go to output_dir/<trial_name>; output_dir is restored after."""
    name = trial_name(trainer, trial)
    if name is None:
        yield
        return
    original = trainer.args.output_dir
    trainer.args.output_dir = os.path.join(original, name)
    try:
        yield
    finally:
        trainer.args.output_dir = original


def trial_params(trial) -> dict | None:
    return None if trial is None else dict(getattr(trial, "params", trial))


def trial_references(trainer, trial) -> tuple[str | None, dict | None]:
    """TrainerState's trial_name (the Trainer's hp_name of the running trial) and trial_params."""
    name = None
    if getattr(trainer, "hp_name", None) is not None and getattr(trainer, "_trial", None) is not None:
        name = trainer.hp_name(trainer._trial)
    return name, trial_params(trial)


def report_to_search(trainer, trial, step: int, metrics: dict) -> None:
    """After an evaluation inside a trial: the objective to optuna, which may prune the trial."""
    if trainer.hp_search_backend is None or trial is None:
        return
    trainer.objective = trainer.compute_objective(dict(metrics))
    if hasattr(trial, "study") and not trial.study._is_multi_objective():
        trial.report(trainer.objective, step)
        if trial.should_prune():
            trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
            raise import_optuna().TrialPruned()
