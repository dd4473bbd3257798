"""Trainer: wires model, data, optimizer and callbacks, and runs train() — the training loop itself,
readable top to bottom. One update's forward, backward and optimizer step live in
lathe.train.stepping (TrainerSteps); evaluation and prediction in lathe.train.predicting."""
from __future__ import annotations

import gc
import inspect
import logging
import time

import torch
from torch import nn

from lathe.train import batching, data, distributed, modeling, runtime
from lathe.train.args_validation import check_output_dir
from lathe.train.callbacks import CallbackHandler
from lathe.train.commit import BackgroundCommitter
from lathe.train.flow import DefaultFlowCallback, PrinterCallback, ProgressCallback
from lathe.train.outputs import TrainOutput
from lathe.train.loaders import TrainerDataLoaders
from lathe.train.predicting import TrainerEvaluation
from lathe.train.resume import TrainerCheckpointing
from lathe.train.stepping import TrainerSteps
from lathe.train.seed import enable_full_determinism, restore_rng_state, set_seed
from lathe.train.state import TrainerControl, TrainerState

logger = logging.getLogger(__name__)


class Trainer(TrainerSteps, TrainerDataLoaders, TrainerCheckpointing, TrainerEvaluation):
    """The transformers.Trainer API on plain PyTorch. Override points (each tested): compute_loss,
    training_step, prediction_step, evaluate, evaluation_loop, create_optimizer, create_scheduler,
    get_train_dataloader, get_eval_dataloader, get_test_dataloader, log."""

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, model_init=None, compute_loss_func=None, compute_metrics=None,
                 callbacks=None, optimizers=(None, None), optimizer_cls_and_kwargs=None,
                 preprocess_logits_for_metrics=None, tokenizer=None):
        from lathe.train.args import TrainingArguments

        if args is None:
            args = TrainingArguments(output_dir="trainer_output")
            logger.info("No TrainingArguments passed; using defaults with output_dir=%r.", args.output_dir)
        self.args = args
        if tokenizer is not None:
            import warnings

            warnings.warn("Trainer(tokenizer=...) is deprecated; use processing_class=... (transformers 5 name).", FutureWarning, stacklevel=2)
            processing_class = processing_class or tokenizer
        # Seed before model_init so the initial weights are reproducible.
        enable_full_determinism(args.seed) if args.full_determinism else set_seed(args.seed)
        self.model_init = model_init
        if model is None:
            if model_init is None:
                raise ValueError("Trainer needs a model or a model_init function.")
            model = self.call_model_init()
        elif model_init is not None:
            raise ValueError("Pass either model or model_init to Trainer, not both.")
        if not isinstance(model, nn.Module):
            raise TypeError(f"Trainer's model must be a torch.nn.Module, got {type(model).__name__}.")
        self.model = self._place_model(model)
        self.model_wrapped = self.model
        self.processing_class = processing_class
        self.data_collator = data_collator if data_collator is not None else self._default_collator(processing_class)
        self._default_collator_used = data_collator is None
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        if args.eval_strategy != "no" and eval_dataset is None and type(self).get_eval_dataloader is Trainer.get_eval_dataloader:
            raise ValueError(
                f"eval_strategy={getattr(args.eval_strategy, 'value', args.eval_strategy)!r} needs an eval_dataset: pass "
                "eval_dataset to Trainer, or set eval_strategy='no'."
            )
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        if self.optimizer is not None and optimizer_cls_and_kwargs is not None:
            raise ValueError("Pass either optimizers=(optimizer, scheduler) or optimizer_cls_and_kwargs, not both.")
        self._inspect_model(self.model)
        self.label_smoother = None
        if args.label_smoothing_factor:
            from lathe.train.loss import LabelSmoother

            self.label_smoother = LabelSmoother(epsilon=args.label_smoothing_factor)
        self._train_batch_size = args.train_batch_size
        self.is_in_train = False
        self.hp_search_backend = None
        self.scaler = None
        self.state = TrainerState(is_local_process_zero=self.is_local_process_zero(), is_world_process_zero=self.is_world_process_zero())
        self.control = TrainerControl()
        default_callbacks = [DefaultFlowCallback, PrinterCallback if args.disable_tqdm else ProgressCallback]
        from lathe.train.integrations import reporter_callbacks

        default_callbacks += reporter_callbacks(args.report_to)
        self.callback_handler = CallbackHandler(default_callbacks + list(callbacks or []), self.model, processing_class, self.optimizer, self.lr_scheduler)
        self.current_flos = 0.0
        self._checkpoint_commits = BackgroundCommitter()
        self._zero_engine = None  # DeepSpeed's engine while train() runs with deepspeed=...
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)

    # ----- wiring -----

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

    @staticmethod
    def _default_collator(processing_class):
        from lathe.train.collators import DataCollatorWithPadding, default_data_collator

        if processing_class is not None and hasattr(processing_class, "pad") and getattr(processing_class, "pad_token_id", None) is not None:
            return DataCollatorWithPadding(processing_class)
        return default_data_collator

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
        in output_dir) continue exactly where that run stopped."""
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        check_output_dir(self.args.output_dir)  # a file may have appeared there since the arguments were made
        if self.model_init is not None:
            set_seed(self.args.seed)  # fresh, reproducible weights for each train() call
            self.model = self.model_wrapped = self._place_model(self.call_model_init(trial))
            self.optimizer = self.lr_scheduler = None
        resume_path = self._resolve_resume_path(resume_from_checkpoint)
        batch_size = self._restore_batch_size(resume_path) or self._train_batch_size
        while True:
            try:
                return self._train_with_batch_size(batch_size, resume_path, trial, ignore_keys_for_eval)
            except BaseException as error:
                self._checkpoint_commits.wait(raise_error=False)  # the last checkpoint still publishes
                lost = distributed.explain_lost_process(error, self.args, self.state.global_step)
                if lost is not None:
                    raise lost from error
                if not (isinstance(error, Exception) and self.args.auto_find_batch_size and runtime.is_out_of_memory(error)):
                    raise
                batch_size = self._smaller_batch_size(batch_size, error)

    def _smaller_batch_size(self, batch_size: int, error: Exception) -> int:
        smaller = int(batch_size * 0.9)
        if smaller < 1:
            raise RuntimeError("auto_find_batch_size: no batch size fits in memory, not even 1.") from error
        logger.warning("Out of memory with batch size %d; retrying with %d (auto_find_batch_size).", batch_size, smaller)
        self.optimizer = self.lr_scheduler = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return smaller

    def _train_with_batch_size(self, batch_size, resume_path, trial, ignore_keys_for_eval):
        args = self.args
        self.is_in_train = True
        self._pending_rng_state = None
        self._train_batch_size = batch_size
        train_dataloader = self.get_train_dataloader()
        plan = batching.plan_training(args, _length(train_dataloader), _length(train_dataloader.dataset), batch_size)
        model = self._prepare_model_for_training()
        self.create_optimizer_and_scheduler(plan.max_steps)
        model = self._start_zero_engine(model)  # DeepSpeed, when configured, wraps model, optimizer and scheduler
        self.scaler = runtime.make_grad_scaler(args, args.device)
        self.state = TrainerState(train_batch_size=batch_size, stateful_callbacks=self._stateful_callbacks())
        self.state.compute_steps(args, plan.max_steps)
        self.state.init_training_references(self, plan.max_steps, plan.num_train_epochs, trial)
        if resume_path is not None:
            self._load_checkpoint(resume_path, plan)
        start = batching.resume_position(self.state.global_step, plan, args.gradient_accumulation_steps, args.ignore_data_skip, self.state.epoch)
        self._attach_to_callbacks(train_dataloader)
        self._begin_run(plan)
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start:
            self._evaluate(trial, ignore_keys_for_eval, skip_scheduler=True)
        for epoch in range(start.epoch, plan.num_train_epochs):
            epoch_batches = self._epoch_batches(train_dataloader, epoch, start)
            self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            first_update = start.updates_done_in_epoch if epoch == start.epoch else 0
            steps_before = self.state.global_step
            for window in batching.update_windows(epoch_batches, plan, args.gradient_accumulation_steps, first_update):
                self._update_step(model, window, epoch, plan)
                self._maybe_log_save_evaluate(model, trial, ignore_keys_for_eval)
                if self.control.should_epoch_stop or self.control.should_training_stop:
                    break
            if self.state.global_step == steps_before and not self.control.should_training_stop:
                self._stop_on_empty_pass(epoch)
            self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
            self._maybe_log_save_evaluate(model, trial, ignore_keys_for_eval)
            if self.control.should_training_stop or self.state.global_step >= plan.max_steps:
                break
        return self._finish_run(plan)

    def _stop_on_empty_pass(self, epoch: int) -> None:
        """A pass over the data gave no batch (an exhausted or empty iterable dataset): stop rather
        than loop forever waiting for max_steps."""
        logger.warning(
            "Pass %d over the training data yielded no batch, so training stops at step %d of %d. An iterable "
            "dataset must be re-iterable (a generator is used up after one pass) and yield at least one batch.",
            epoch, self.state.global_step, self.state.max_steps,
        )
        self.control.should_training_stop = True

    def _epoch_batches(self, dataloader, epoch: int, start):
        """The epoch's batch iterator; on the resumed epoch, already-trained batches are skipped at
        the sampler (or read and dropped where the loader cannot seek), and the checkpoint's RNG
        state is restored at the point of the epoch where the interrupted run saved it. Creating the
        iterator draws a seed from the global RNG: mid-epoch the interrupted run had made that draw
        (and read the skipped batches) before saving, so restore after them; at an epoch boundary
        (or with ignore_data_skip) it saved before this epoch's iterator existed, so restore first."""
        data.set_epoch(dataloader, epoch)
        skip = start.batches_to_skip if epoch == start.epoch else 0
        self._batches_done_in_epoch = skip
        restore = None
        if epoch == start.epoch:
            restore, self._pending_rng_state = self._pending_rng_state, None
        if restore is not None and skip == 0:
            restore_rng_state(restore)
        iterator = iter(data.skip_batches(dataloader, skip))
        if restore is not None and skip > 0:
            restore_rng_state(restore)
        return iterator

    def _update_step(self, model, window: list, epoch: int, plan) -> None:  # noqa: C901 (flat on purpose)
        """One optimizer update over an accumulation window of micro-batches."""
        args, state = self.args, self.state
        self.control = self.callback_handler.on_step_begin(args, state, self.control)
        num_items = batching.count_label_items(window, self._loss_shifts_labels) if self._counts_items() else None
        self._loss_world_scale = 1
        if num_items is not None and args.average_tokens_across_devices and distributed.is_distributed():
            # every rank divides by the window's count over all ranks; DDP then averages the gradients
            num_items = distributed.sum_across_ranks(num_items, args.device)
            self._loss_world_scale = distributed.world_size()
        self.current_gradient_accumulation_steps = len(window)
        for index, inputs in enumerate(window):
            with distributed.gradient_sync(model, sync=index == len(window) - 1):
                loss = self.training_step(model, inputs, num_items)
            self._losses.add(loss, state.global_step - self._globalstep_last_logged)
            self.current_flos += float(self.floating_point_ops(inputs))
            if args.include_num_input_tokens_seen != "no":
                state.num_input_tokens_seen += batching.count_input_tokens(inputs, args.include_num_input_tokens_seen, self.main_input_name)
            if index < len(window) - 1:
                self.control = self.callback_handler.on_substep_end(args, state, self.control)
        self._optimizer_step(model)
        state.global_step += 1
        self._batches_done_in_epoch += len(window)
        # Iterable datasets have no epoch length; like transformers, count max_steps windows as one.
        batches_per_epoch = plan.batches_per_epoch or plan.max_steps * args.gradient_accumulation_steps
        state.epoch = epoch + self._batches_done_in_epoch / batches_per_epoch
        self.control = self.callback_handler.on_step_end(args, state, self.control)

    def _prepare_model_for_training(self):
        args = self.args
        if args.gradient_checkpointing:
            runtime.enable_gradient_checkpointing(self.model, args.gradient_checkpointing_kwargs)
        wrapped = distributed.wrap_model(self.model, args)  # DDP under several processes
        self.model_wrapped = runtime.compile_model(wrapped, args) if args.torch_compile else wrapped
        return self.model_wrapped

    def _start_zero_engine(self, model):
        self._zero_engine = None
        if not self.args.deepspeed:
            return model
        from lathe.train.integrations import deepspeed_zero

        self.floating_point_ops({})  # counts the parameters (for total_flos) before ZeRO-3 partitions them
        engine = deepspeed_zero.initialize(model, self.optimizer, self.lr_scheduler, self.args)
        self._zero_engine = self.model_wrapped = engine
        self.optimizer, self.lr_scheduler = engine.optimizer, engine.lr_scheduler
        return engine

    def _attach_to_callbacks(self, train_dataloader) -> None:
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader = train_dataloader

    def _begin_run(self, plan) -> None:
        self._losses = batching.LossTracker(self.args.device, self.args.logging_nan_inf_filter)
        self._total_loss = 0.0
        self._all_parameters = list(self.model.parameters())
        self._trainable_parameters = [p for p in self._all_parameters if p.requires_grad]
        # Optimizers that change which parameters train (BAdam's blocks) or give sparse gradients say so.
        self._optimizer_flips_requires_grad = bool(getattr(self.optimizer, "changes_requires_grad", False))
        self._sparse_gradients = bool(getattr(self.optimizer, "sparse_gradients", False))
        self._globalstep_last_logged = self.state.global_step
        self._first_step_of_run = self.state.global_step
        self._initial_num_input_tokens_seen = self.state.num_input_tokens_seen
        self._grad_norm = None
        self._last_learning_rate = None
        self._start_time = time.time()
        self.model.zero_grad(set_to_none=True)

    def _finish_run(self, plan) -> TrainOutput:
        args, state = self.args, self.state
        self._checkpoint_commits.wait()  # every checkpoint is published before train() returns
        self._total_loss += distributed.mean_across_ranks(self._losses.take(), args.device)
        if self._losses.nonfinite:
            logger.warning("%d micro-batches had a non-finite loss; the logged loss counts them as the running mean (logging_nan_inf_filter).", self._losses.nonfinite)
        steps_run = max(state.global_step - self._first_step_of_run, 0)
        train_loss = self._total_loss / steps_run if steps_run else 0.0
        if args.load_best_model_at_end and state.best_model_checkpoint is not None:
            self._load_best_model()
        from lathe.train.evaluation import speed_metrics

        samples_run = steps_run * self._train_batch_size * args.gradient_accumulation_steps * args.world_size  # all ranks, as transformers
        metrics = speed_metrics("train", self._start_time, num_samples=samples_run, num_steps=steps_run)
        self.store_flos()
        metrics["total_flos"] = state.total_flos
        metrics["train_loss"] = train_loss
        self.is_in_train = False
        self.log(metrics)
        self._final_rotation()
        self.control = self.callback_handler.on_train_end(args, state, self.control)
        return TrainOutput(state.global_step, train_loss, metrics)

    def _maybe_log_save_evaluate(self, model, trial, ignore_keys_for_eval) -> None:
        """The one place where the Trainer acts on the flags the callbacks set."""
        state, control = self.state, self.control
        if control.should_log and state.global_step > self._globalstep_last_logged:
            window_loss = distributed.mean_across_ranks(self._losses.take(), self.args.device)
            logs = {"loss": window_loss / (state.global_step - self._globalstep_last_logged)}
            if self._grad_norm is not None:
                logs["grad_norm"] = float(self._grad_norm)
            logs["learning_rate"] = self._last_learning_rate if self._last_learning_rate is not None else self._get_learning_rate()
            self._total_loss += window_loss
            self._globalstep_last_logged = state.global_step
            self.store_flos()
            self.log(logs, self._start_time)
        if self.control.should_evaluate:
            metrics = self._evaluate(trial, ignore_keys_for_eval)
            is_new_best = self._update_best_metric(metrics)
            if self.args.save_strategy == "best":
                self.control.should_save = is_new_best
        if self.control.should_save:
            self._save_checkpoint(model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def store_flos(self) -> None:
        self.state.total_flos += self.current_flos
        self.current_flos = 0.0

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add epoch (and tokens seen) to `logs`, append them to log_history, call on_log."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                from lathe.train.evaluation import speed_metrics

                # train_runtime and train_tokens_per_second as transformers logs them, counting only
                # this train() call's tokens: a resumed run's start_time is its own start.
                tokens = self.state.num_input_tokens_seen - self._initial_num_input_tokens_seen
                logs.update(speed_metrics("train", start_time, num_tokens=tokens))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)


def _length(obj) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None
