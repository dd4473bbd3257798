"""Trainer: wires model, data, optimizer and callbacks, and is the list of its methods: the documented
override points and the rest of the transformers API. The methods whose work is elsewhere name the
module on the line that attaches them; the training loop and one update are lathe/train/loop.py."""

from __future__ import annotations

import gc
import inspect
import logging
import warnings
from collections.abc import Mapping

import torch
from torch import nn

from lathe.train import batching, loop, modeling, resume, runtime, saving, session, stepping
from lathe.train.args.validation import check_output_dir, make_output_dir
from lathe.train.callbacks.flow import default_callback_handler
from lathe.train.checkpoints.commit import BackgroundCommitter
from lathe.train.data import loaders
from lathe.train.data.collators import default_collator_for
from lathe.train.evaluation import predicting
from lathe.train.features.memory import TrainerMemoryTracker
from lathe.train.loss import causal_lm
from lathe.train.loss.smoothing import label_smoother_for
from lathe.train.optim import schedules
from lathe.train.parallel import distributed
from lathe.train.seed import enable_full_determinism, set_seed
from lathe.train.state import TrainerControl, TrainerState
from lathe.train.surface import TrainerSurface

logger = logging.getLogger(__name__)


class Trainer(TrainerSurface):
    """The transformers.Trainer API on plain PyTorch.

    Where things happen: train() retries on out-of-memory around _training_loop (loop.py: the epochs),
    whose update_step is one optimizer update: each micro-batch through training_step (forward in
    compute_loss, backward through the run's back-end, stepping.py), then clip, optimizer step,
    scheduler step and zero through the back-end, in transformers' event order. After each update
    _maybe_log_save_evaluate acts on the flags the callbacks set. The documented override points (each
    tested): compute_loss, training_step, prediction_step, evaluate, evaluation_loop, create_optimizer,
    create_scheduler, get_train_dataloader, get_eval_dataloader, get_test_dataloader, log."""

    # eval_loss counts a short last batch once per real sample (evaluation.loss_weight); Seq2SeqTrainer does not.
    _trims_last_eval_batch = True

    def __init__(
        self,
        model=None,
        args=None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        model_init=None,
        compute_loss_func=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        optimizer_cls_and_kwargs=None,
        preprocess_logits_for_metrics=None,
        tokenizer=None,
    ):
        from lathe.train.args.training_args import TrainingArguments

        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")  # transformers 5.23's Trainer default
            logger.info(f"No `TrainingArguments` passed, using `output_dir={args.output_dir}`.")  # transformers' words
        self.args = args
        runtime.apply_log_level(args)
        self._memory_tracker = TrainerMemoryTracker(args.skip_memory_metrics).started("init")
        runtime.apply_tf32(args)
        processing_class = _processing_class(processing_class, tokenizer)
        # Seed before model_init so the initial weights are reproducible.
        enable_full_determinism(args.seed) if args.full_determinism else set_seed(args.seed)
        self.model_init = model_init
        self.model = self.model_wrapped = self._place_model(self._given_or_initial_model(model, model_init))
        self.processing_class = processing_class
        self.data_collator = data_collator if data_collator is not None else default_collator_for(processing_class)
        self._default_collator_used = data_collator is None
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.compute_loss_func, self.compute_metrics = compute_loss_func, compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self._created_lr_scheduler = False  # a scheduler passed in is the user's: it is never rebuilt
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self._check_what_was_given()
        self._inspect_model(self.model)
        self.label_smoother = label_smoother_for(self.model, args.label_smoothing_factor)
        self._train_batch_size = args.train_batch_size
        self.is_in_train, self.neftune_noise_alpha = False, args.neftune_noise_alpha
        self.hp_search_backend = self.hp_name = self._trial = self.hub_model_id = None
        # Set while train() runs: the fp16 GradScaler, DeepSpeed's engine, the run's tally (run.TrainingRun).
        self.scaler = self._zero_engine = self._run = None
        self._backend = stepping.PlainBackend(None, [], None, None)  # the run's back-end (stepping.choose_backend)
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(), is_world_process_zero=self.is_world_process_zero()
        )
        self.control = TrainerControl()
        self.callback_handler = default_callback_handler(self, callbacks)
        self.current_flos, self._flops_estimate = 0.0, None
        self._checkpoint_commits = BackgroundCommitter()
        if args.should_save:  # transformers makes output_dir here, before anything is written into it
            make_output_dir(args.output_dir)
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)
        self._finish_init()

    # ----- wiring -----

    def _finish_init(self) -> None:
        if getattr(self.model, "config", None) is not None:
            self.model.config.use_cache = self.args.use_cache  # as transformers does, whatever the config said
        self._memory_tracker.stop_and_update_metrics(stage="init")

    def _check_what_was_given(self) -> None:
        args = self.args
        if (
            args.eval_strategy != "no"
            and self.eval_dataset is None
            and type(self).get_eval_dataloader is Trainer.get_eval_dataloader
        ):
            raise ValueError(
                f"eval_strategy={getattr(args.eval_strategy, 'value', args.eval_strategy)!r} needs an eval_dataset: pass "
                "eval_dataset to Trainer, or set eval_strategy='no'."
            )
        if self.optimizer is not None and self.optimizer_cls_and_kwargs is not None:
            raise ValueError("Pass either optimizers=(optimizer, scheduler) or optimizer_cls_and_kwargs, not both.")

    def _given_or_initial_model(self, model, model_init) -> nn.Module:
        if model is None:
            if model_init is None:
                raise ValueError("Trainer needs a model or a model_init function.")
            model = self.call_model_init()
        elif model_init is not None:
            raise ValueError("Pass either model or model_init to Trainer, not both.")
        if not isinstance(model, nn.Module):
            raise TypeError(f"Trainer's model must be a torch.nn.Module, got {type(model).__name__}.")
        return model

    def _place_model(self, model: nn.Module) -> nn.Module:
        if getattr(model, "hf_device_map", None) is not None or getattr(model, "is_loaded_in_4bit", False):
            return model  # already placed across devices by its loader
        return model.to(self.args.device)

    def _inspect_model(self, model: nn.Module) -> None:
        facts = modeling.inspect_model(model, self.args.label_names)
        self.model_accepts_loss_kwargs = facts.accepts_loss_kwargs
        self.label_names = facts.label_names
        self.can_return_loss = facts.can_return_loss
        self.main_input_name = facts.main_input_name
        self._loss_shifts_labels = facts.shifts_labels
        self._lm_loss = causal_lm.choose_loss_path(model, self.args, self.compute_loss_func)
        self._logits_wanted = False  # prediction_step sets it while compute_metrics needs the logits

    def call_model_init(self, trial=None):
        parameters = inspect.signature(self.model_init).parameters
        model = self.model_init() if len(parameters) == 0 else self.model_init(trial)
        if model is None:
            raise RuntimeError("model_init returned None; it must return a torch.nn.Module.")
        return model

    def add_callback(self, callback):
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback):
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback):
        self.callback_handler.remove_callback(callback)

    def is_local_process_zero(self) -> bool:
        return self.args.local_process_index == 0

    def is_world_process_zero(self) -> bool:
        return self.args.process_index == 0

    # ----- training -----

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """Train; with resume_from_checkpoint (a path, or True for the newest complete checkpoint
        in output_dir) continue exactly where that run stopped.

        This method resolves the checkpoint and retries with a smaller batch on out-of-memory
        (auto_find_batch_size). The loop is _training_loop, in lathe/train/loop.py: training_loop runs
        the epochs, update_step one optimizer update (forward and backward in training_step, below)."""
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        check_output_dir(self.args.output_dir)  # a file may have appeared there since the arguments were made
        # model_init's fresh model, memory tracking, NEFTune's hook, a search trial's arguments (session.py)
        with session.train_call(self, trial):
            return self._train_with_retries(resume_from_checkpoint, trial, ignore_keys_for_eval)

    def _train_with_retries(self, resume_from_checkpoint, trial, ignore_keys_for_eval):
        resume_path = resume.resolve_resume_path(self.args, resume_from_checkpoint)
        batch_size = resume.restore_batch_size(self.args, resume_path) or self._train_batch_size
        while True:
            try:
                return self._training_loop(batch_size, resume_path, trial, ignore_keys_for_eval)
            except BaseException as error:
                self._checkpoint_commits.wait(raise_error=False)  # the last checkpoint still publishes
                lost = distributed.explain_lost_process(error, self.args, self.state.global_step)
                if lost is not None:
                    raise lost from error
                if not (
                    isinstance(error, Exception) and self.args.auto_find_batch_size and runtime.is_out_of_memory(error)
                ):
                    raise
                batch_size = self._smaller_batch_size(batch_size, error)

    def _smaller_batch_size(self, batch_size: int, error: Exception) -> int:
        smaller = int(batch_size * 0.9)
        if smaller < 1:
            raise RuntimeError("auto_find_batch_size: no batch size fits in memory, not even 1.") from error
        logger.warning(
            "Out of memory with batch size %d; retrying with %d (auto_find_batch_size).", batch_size, smaller
        )
        self.optimizer = self.lr_scheduler = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return smaller

    def _counts_items(self) -> bool:
        # Label smoothing divides by the count too (as in transformers 5), when the model takes loss kwargs.
        return self.model_accepts_loss_kwargs or self.compute_loss_func is not None

    def _maybe_log_save_evaluate(self, model, trial, ignore_keys_for_eval) -> None:
        """The one place where the Trainer acts on the flags the callbacks set."""
        state, control, run = self.state, self.control, self._run
        if control.should_log and state.global_step > run.step_last_logged:
            logs = {"loss": run.take_logged_loss(state.global_step, self.args.device)}
            if self._backend.grad_norm is not None:
                logs["grad_norm"] = float(self._backend.grad_norm)
            logs["learning_rate"] = run.learning_rate if run.learning_rate is not None else self._get_learning_rate()
            self.store_flos()
            self.log(logs, run.start_time)
        if self.control.should_evaluate:
            metrics = self._evaluate(trial, ignore_keys_for_eval)
            is_new_best = saving.update_best_metric(self.args, self.state, metrics)
            if self.args.save_strategy == "best":
                self.control.should_save = is_new_best
        if self.control.should_save:
            self._save_checkpoint(model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add epoch (and tokens seen) to `logs`, append them to log_history, call on_log."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                from lathe.train.evaluation.loop import speed_metrics

                # train_runtime and train_tokens_per_second as transformers logs them, counting only
                # this train() call's tokens: a resumed run's start_time is its own start.
                tokens = self.state.num_input_tokens_seen - (self._run.tokens_at_start if self._run else 0)
                logs.update(speed_metrics("train", start_time, num_tokens=tokens))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)

    # ----- one micro-batch: the override points of the maths -----

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached, normalised loss."""
        # model.train() walks every module; only evaluation turns training off. A DDP wrapper is created in
        # training mode around a model that from_pretrained left in eval mode: ask the inner model too.
        if not model.training or not self.model.training:
            model.train()
        inputs = self._prepare_inputs(inputs)
        with runtime.autocast_context(self.args, self._autocast_dtype), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        runtime.maybe_empty_device_cache(self.args, self.state.global_step)  # torch_empty_cache_steps
        # Divided by the accumulation window (or by its label tokens, inside the loss), the micro-batch
        # losses of a window add up to the loss of the whole window: batching.normalise_loss says why.
        counted = num_items_in_batch is not None and self._counts_items()
        by_items, world_scale = batching.loss_scale(
            counted, self.args.average_tokens_across_devices, self.loss_is_scaled_for_ga
        )
        loss = batching.normalise_loss(loss, self.current_gradient_accumulation_steps, by_items, world_scale)
        self._backend.backward(loss)
        return loss.detach()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The model's loss, or label smoothing / compute_loss_func applied to its outputs (modeling.compute_loss)."""
        try:
            chunked = causal_lm.trainer_path(self, inputs)
            if chunked is not None:
                # The label smoother's denominator whenever it smooths, else the model's (batching.py).
                counts = self.label_smoother is not None or self.model_accepts_loss_kwargs
                loss, outputs = chunked.compute_loss(model, inputs, num_items_in_batch if counts else None)
                return (loss, outputs) if return_outputs else loss
            loss, outputs = modeling.compute_loss(
                model,
                inputs,
                num_items_in_batch,
                label_smoother=self.label_smoother,
                compute_loss_func=self.compute_loss_func,
                accepts_loss_kwargs=self.model_accepts_loss_kwargs,
                shifts_labels=self._loss_shifts_labels,
            )
        except (RuntimeError, ValueError) as error:
            explained = modeling.explain_label_error(error, inputs, self.label_names)
            if explained is None:
                raise
            raise explained from error
        return (loss, outputs) if return_outputs else loss

    def _prepare_inputs(self, inputs):
        if isinstance(inputs, Mapping) and len(inputs) == 0:
            raise ValueError(
                "A batch reached the model empty: no dataset column matches the model's forward arguments "
                f"({', '.join(loaders.signature_columns(self.model, self.label_names))}). Rename the columns or set "
                "remove_unused_columns=False."
            )
        return runtime.move_to_device(inputs, self.args.device)

    @property
    def _autocast_dtype(self):
        return runtime.autocast_dtype(self.args)

    # ----- optimizer and scheduler (optim/optimizers.py, optim/schedules.py) -----

    def get_decay_parameter_names(self, model) -> list[str]:
        from lathe.train.optim.optimizers import get_decay_parameter_names

        return get_decay_parameter_names(model)

    def create_optimizer(self, model=None):
        from lathe.train.optim.optimizers import create_optimizer

        if self.optimizer is None:
            self.optimizer = create_optimizer(model or self.model, self.args, self.optimizer_cls_and_kwargs)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        from lathe.train.optim.optimizers import get_scheduler

        if self.lr_scheduler is None:
            self._created_lr_scheduler = True  # so that a second train() builds a fresh one, as transformers
            self.lr_scheduler = get_scheduler(
                self.args.lr_scheduler_type,
                optimizer=optimizer or self.optimizer,
                num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
                num_training_steps=num_training_steps,
                scheduler_specific_kwargs=self.args.lr_scheduler_kwargs,
            )
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps, optimizer=self.optimizer)

    def _get_learning_rate(self) -> float:
        if schedules.steps_on_metric(self.lr_scheduler):
            return self.optimizer.param_groups[0]["lr"]
        return self.lr_scheduler.get_last_lr()[0]

    # ----- the rest of the API: Trainer methods whose code is in the module named on each line -----

    _training_loop = loop.training_loop  # the epochs and their update steps (loop.update_step)

    get_train_dataloader = loaders.get_train_dataloader
    get_eval_dataloader = loaders.get_eval_dataloader
    get_test_dataloader = loaders.get_test_dataloader

    evaluate = predicting.evaluate
    predict = predicting.predict
    evaluation_loop = predicting.evaluation_loop
    prediction_step = predicting.prediction_step
    _evaluate = predicting.evaluate_during_training  # evaluation inside train()

    save_model = saving.save_model
    _save_checkpoint = saving.save_checkpoint
    _best_checkpoint_path = saving.best_checkpoint_path


def _processing_class(processing_class, tokenizer):
    if tokenizer is not None:
        message = "Trainer(tokenizer=...) is deprecated; use processing_class=... (transformers 5 name)."
        warnings.warn(message, FutureWarning, stacklevel=3)
        return processing_class or tokenizer
    return processing_class
