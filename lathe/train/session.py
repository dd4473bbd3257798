"""What one train() call sets up before its loop and undoes after it, in transformers' order: memory
tracking of the "train" stage, the fresh model from model_init, NEFTune's noise hook on the input
embeddings, and a hyperparameter-search trial's arguments and checkpoint folder (output_dir/run-N)."""

from __future__ import annotations

import contextlib

from lathe.train.features import hp_search, neftune
from lathe.train.seed import set_seed


@contextlib.contextmanager
def train_call(trainer, trial):
    trainer._memory_tracker.start("train")
    noise = None
    try:
        if trainer.model_init is not None:
            set_seed(trainer.args.seed)  # fresh, reproducible weights for each train() call
            trainer.model = trainer.model_wrapped = trainer._place_model(trainer.call_model_init(trial))
            trainer.optimizer = trainer.lr_scheduler = None
        if trainer.neftune_noise_alpha is not None:
            noise = neftune.activate(trainer.model, trainer.neftune_noise_alpha)
        hp_search.apply_trial(trainer, trial)  # the trial's hyperparameters, set on the arguments
        with hp_search.trial_output_dir(trainer, trial):
            yield
    finally:
        trainer._memory_tracker.stop("train")  # only when training failed: success reported it already
        if noise is not None:
            neftune.deactivate(noise)  # the noise is for training only
