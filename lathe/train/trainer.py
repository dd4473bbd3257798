"""Trainer: wires model, data, optimizer and callbacks; runs the training loop (_training_loop) and one
update (_update_step), both readable top to bottom here; and is the list of documented override points,
each a method of this class that calls the module which does the work."""
from __future__ import annotations

import gc
import inspect
import logging
import warnings
from collections.abc import Mapping

import torch
from torch import nn

from lathe.train import batching, data, distributed, loaders, modeling, predicting, resume, runtime, stepping
from lathe.train.args_validation import check_output_dir
from lathe.train.callbacks import CallbackHandler
from lathe.train.commit import BackgroundCommitter
from lathe.train.flow import DefaultFlowCallback, PrinterCallback, ProgressCallback
from lathe.train.outputs import TrainOutput
from lathe.train.run import TrainingRun
from lathe.train.seed import enable_full_determinism, restore_rng_state, set_seed
from lathe.train.state import TrainerControl, TrainerState

logger = logging.getLogger(__name__)


class Trainer:
    """The transformers.Trainer API on plain PyTorch.

    Where things are: train() -> _training_loop (epochs) -> _update_step (one update: micro-batches
    through training_step, then clip, step, schedule, zero through the run's back-end, stepping.py) ->
    _maybe_log_save_evaluate (acts on the flags callbacks set). The override points, each tested:
    compute_loss, training_step, prediction_step, evaluate, evaluation_loop, create_optimizer,
    create_scheduler, get_train_dataloader, get_eval_dataloader, get_test_dataloader, log; their work
    is done in modeling.py (the loss), predicting.py and evaluation.py (evaluation), optim.py and
    schedules.py, loaders.py, resume.py (checkpoints)."""

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
            warnings.warn("Trainer(tokenizer=...) is deprecated; use processing_class=... (transformers 5 name).", FutureWarning, stacklevel=2)
            processing_class = processing_class or tokenizer
        # Seed before model_init so the initial weights are reproducible.
        enable_full_determinism(args.seed) if args.full_determinism else set_seed(args.seed)
        self.model_init = model_init
        self.model = self.model_wrapped = self._place_model(self._given_or_initial_model(model, model_init))
        self.processing_class = processing_class
        self.data_collator = data_collator if data_collator is not None else self._default_collator(processing_class)
        self._default_collator_used = data_collator is None
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
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
        self.scaler = None  # torch.amp.GradScaler while train() runs with fp16
        self._zero_engine = None  # DeepSpeed's engine while train() runs with deepspeed=...
        self._backend = stepping.PlainBackend([], None, None)  # the run's back-end (stepping.choose_backend)
        self._run = None  # TrainingRun: the tally of the current train() call
        self.state = TrainerState(is_local_process_zero=self.is_local_process_zero(), is_world_process_zero=self.is_world_process_zero())
        self.control = TrainerControl()
        self.callback_handler = self._make_callback_handler(callbacks)
        self.current_flos = 0.0
        self._flops_estimate = None
        self._checkpoint_commits = BackgroundCommitter()
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)

    # ----- wiring -----

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

    @staticmethod
    def _default_collator(processing_class):
        from lathe.train.collators import DataCollatorWithPadding, default_data_collator

        if processing_class is not None and hasattr(processing_class, "pad") and getattr(processing_class, "pad_token_id", None) is not None:
            return DataCollatorWithPadding(processing_class)
        return default_data_collator

    def _make_callback_handler(self, callbacks) -> CallbackHandler:
        """Flow first, then printer or progress bar, then the report_to reporters, then the user's."""
        from lathe.train.integrations import reporter_callbacks

        defaults = [DefaultFlowCallback, PrinterCallback if self.args.disable_tqdm else ProgressCallback]
        defaults += reporter_callbacks(self.args.report_to)
        handler = CallbackHandler(defaults + list(callbacks or []), self.model, self.processing_class, self.optimizer, self.lr_scheduler)
        if not any(isinstance(callback, DefaultFlowCallback) for callback in handler.callbacks):
            logger.warning(
                "The Trainer will not log, evaluate, save or stop at max_steps without a DefaultFlowCallback; "
                "add one with trainer.add_callback(DefaultFlowCallback). Current callbacks:\n%s", handler.callback_list
            )
        return handler

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
        (auto_find_batch_size); the loop itself is _training_loop, and one update is _update_step."""
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        check_output_dir(self.args.output_dir)  # a file may have appeared there since the arguments were made
        if self.model_init is not None:
            set_seed(self.args.seed)  # fresh, reproducible weights for each train() call
            self.model = self.model_wrapped = self._place_model(self.call_model_init(trial))
            self.optimizer = self.lr_scheduler = None
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

    def _training_loop(self, batch_size: int, resume_path: str | None, trial, ignore_keys_for_eval) -> TrainOutput:
        """Epochs of update steps, in transformers' event order: train_begin, then per epoch
        epoch_begin, the updates (each followed by acting on the flags callbacks set), epoch_end."""
        args = self.args
        self.is_in_train = True
        self._train_batch_size = batch_size
        train_dataloader = self.get_train_dataloader()
        plan = batching.plan_training(args, _length(train_dataloader), _length(train_dataloader.dataset), batch_size)
        model = self._prepare_for_training(plan)
        self.state = self._new_state(batch_size, plan, trial)
        rng_state = None
        if resume_path is not None:
            self.state, rng_state = resume.load_checkpoint(self, resume_path, plan)
        start = batching.resume_position(self.state.global_step, plan, args.gradient_accumulation_steps, args.ignore_data_skip, self.state.epoch)
        self._begin_run(train_dataloader)
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start:
            self._evaluate(trial, ignore_keys_for_eval, skip_scheduler=True)
        for epoch in range(start.epoch, plan.num_train_epochs):
            epoch_batches = self._epoch_batches(train_dataloader, epoch, start, rng_state if epoch == start.epoch else None)
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
        return self._finish_run()

    def _update_step(self, model, window: list, epoch: int, plan) -> None:
        """One optimizer update over an accumulation window of micro-batches."""
        args, state, run, backend = self.args, self.state, self._run, self._backend
        self.control = self.callback_handler.on_step_begin(args, state, self.control)
        num_items = self._count_window_items(window)
        self.current_gradient_accumulation_steps = len(window)  # training_step divides by it (a short last window too)
        for index, inputs in enumerate(window):
            is_last = index == len(window) - 1
            with backend.gradient_sync(model, is_last):
                loss = self.training_step(model, inputs, num_items)
            self._tally_micro_batch(inputs, loss)
            if not is_last:
                self.control = self.callback_handler.on_substep_end(args, state, self.control)
        backend.clip_gradients(args.max_grad_norm)  # grad_norm logged is the norm before clipping
        self.control = self.callback_handler.on_pre_optimizer_step(args, state, self.control)
        run.learning_rate = self._get_learning_rate()  # the rate this update uses: read before the scheduler moves it
        updated = backend.optimizer_step()  # False after an fp16 overflow: no update, so no schedule step either
        self.control = self.callback_handler.on_optimizer_step(args, state, self.control)
        if updated:
            backend.scheduler_step()
        backend.zero_grad()
        state.global_step += 1
        run.batches_done_in_epoch += len(window)
        # Iterable datasets have no epoch length; like transformers, count max_steps windows as one.
        batches_per_epoch = plan.batches_per_epoch or plan.max_steps * args.gradient_accumulation_steps
        state.epoch = epoch + run.batches_done_in_epoch / batches_per_epoch
        self.control = self.callback_handler.on_step_end(args, state, self.control)

    def _count_window_items(self, window: list):
        """The loss denominator of the whole window (batching.count_label_items): the label tokens of all
        its micro-batches, so that k micro-batches of b examples train as one batch of k*b. With
        average_tokens_across_devices it is summed over ranks, so every rank divides by the global count
        (training_step then undoes DDP's average over ranks). None: each loss is a mean of its own batch."""
        if not self._counts_items():
            return None
        num_items = batching.count_label_items(window, self._loss_shifts_labels)
        if num_items is not None and self.args.average_tokens_across_devices:
            num_items = distributed.sum_across_ranks(num_items, self.args.device)  # unchanged in one process
        return num_items

    def _counts_items(self) -> bool:
        # Label smoothing divides by the count too (as in transformers 5), when the model takes loss kwargs.
        return self.model_accepts_loss_kwargs or self.compute_loss_func is not None

    def _tally_micro_batch(self, inputs, loss: torch.Tensor) -> None:
        """The micro-batch's share of the logged loss, of total_flos and of num_input_tokens_seen."""
        self._run.losses.add(loss, self.state.global_step - self._run.step_last_logged)
        self.current_flos += float(self.floating_point_ops(inputs))
        if self.args.include_num_input_tokens_seen != "no":
            mode = self.args.include_num_input_tokens_seen
            self.state.num_input_tokens_seen += batching.count_input_tokens(inputs, mode, self.main_input_name)

    def _epoch_batches(self, dataloader, epoch: int, start, rng_state: dict | None):
        """The epoch's batch iterator; on the resumed epoch, already-trained batches are skipped at
        the sampler (or read and dropped where the loader cannot seek), and the checkpoint's RNG
        state is restored at the point of the epoch where the interrupted run saved it. Creating the
        iterator draws a seed from the global RNG: mid-epoch the interrupted run had made that draw
        (and read the skipped batches) before saving, so restore after them; at an epoch boundary
        (or with ignore_data_skip) it saved before this epoch's iterator existed, so restore first."""
        data.set_epoch(dataloader, epoch)
        skip = start.batches_to_skip if epoch == start.epoch else 0
        self._run.batches_done_in_epoch = skip
        if rng_state is not None and skip == 0:
            restore_rng_state(rng_state)
        iterator = iter(data.skip_batches(dataloader, skip))
        if rng_state is not None and skip > 0:
            restore_rng_state(rng_state)
        return iterator

    def _stop_on_empty_pass(self, epoch: int) -> None:
        """A pass over the data gave no batch (an exhausted or empty iterable dataset): stop rather
        than loop forever waiting for max_steps."""
        logger.warning(
            "Pass %d over the training data yielded no batch, so training stops at step %d of %d. An iterable "
            "dataset must be re-iterable (a generator is used up after one pass) and yield at least one batch.",
            epoch, self.state.global_step, self.state.max_steps,
        )
        self.control.should_training_stop = True

    def _prepare_for_training(self, plan):
        """Gradient checkpointing, DDP / FSDP2 / torch.compile wrapping, optimizer and scheduler, then
        DeepSpeed's engine around them when configured, and the fp16 GradScaler. Returns the model to train."""
        args = self.args
        if args.gradient_checkpointing:
            runtime.enable_gradient_checkpointing(self.model, args.gradient_checkpointing_kwargs)
        wrapped = distributed.wrap_model(self.model, args)  # DDP under several processes
        model = self.model_wrapped = runtime.compile_model(wrapped, args) if args.torch_compile else wrapped
        self.create_optimizer_and_scheduler(plan.max_steps)
        self._zero_engine = None
        if args.deepspeed:
            from lathe.train.integrations import deepspeed_zero

            self.floating_point_ops({})  # counts the parameters (for total_flos) before ZeRO-3 partitions them
            engine = deepspeed_zero.initialize(model, self.optimizer, self.lr_scheduler, args)
            model = self._zero_engine = self.model_wrapped = engine
            self.optimizer, self.lr_scheduler = engine.optimizer, engine.lr_scheduler
        self.scaler = runtime.make_grad_scaler(args, args.device)
        return model

    def _new_state(self, batch_size: int, plan, trial) -> TrainerState:
        state = TrainerState(train_batch_size=batch_size, stateful_callbacks=resume.stateful_callbacks(self))
        state.compute_steps(self.args, plan.max_steps)
        state.init_training_references(self, plan.max_steps, plan.num_train_epochs, trial)
        return state

    def _begin_run(self, train_dataloader) -> None:
        """Hand the run's objects to the callbacks, choose the back-end, start the tally."""
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader = train_dataloader
        self._backend = stepping.choose_backend(list(self.model.parameters()), self.optimizer, self.lr_scheduler, self.scaler, self._zero_engine)
        self._run = TrainingRun.start(self.state, self.args)
        self.model.zero_grad(set_to_none=True)

    def _finish_run(self) -> TrainOutput:
        from lathe.train.evaluation import speed_metrics

        args, state, run = self.args, self.state, self._run
        self._checkpoint_commits.wait()  # every checkpoint is published before train() returns
        train_loss = run.train_loss(state.global_step, args.device)
        if run.losses.nonfinite:
            logger.warning("%d micro-batches had a non-finite loss; the logged loss counts them as the running mean (logging_nan_inf_filter).", run.losses.nonfinite)
        if args.load_best_model_at_end and state.best_model_checkpoint is not None:
            resume.load_best_model(self)
        steps_run = run.steps_run(state.global_step)
        samples_run = steps_run * self._train_batch_size * args.gradient_accumulation_steps * args.world_size  # all ranks, as transformers
        metrics = speed_metrics("train", run.start_time, num_samples=samples_run, num_steps=steps_run)
        self.store_flos()
        metrics["total_flos"] = state.total_flos
        metrics["train_loss"] = train_loss
        self.is_in_train = False
        self.log(metrics)
        resume.final_rotation(args, self._best_checkpoint_path())
        self.control = self.callback_handler.on_train_end(args, state, self.control)
        return TrainOutput(state.global_step, train_loss, metrics)

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
            is_new_best = resume.update_best_metric(self.args, self.state, metrics)
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
                tokens = self.state.num_input_tokens_seen - (self._run.tokens_at_start if self._run else 0)
                logs.update(speed_metrics("train", start_time, num_tokens=tokens))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)

    # ----- one micro-batch: the override points of the maths -----

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached, normalised loss."""
        if not model.training:  # model.train() walks every module; only evaluation turns training off
            model.train()
        inputs = self._prepare_inputs(inputs)
        with runtime.autocast_context(self.args.device, self._autocast_dtype):
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        # Divided by the accumulation window (or by its label tokens, inside the loss), the micro-batch
        # losses of a window add up to the loss of the whole window: batching.normalise_loss says why.
        by_items = num_items_in_batch is not None and self._counts_items()
        world_scale = distributed.world_size() if by_items and self.args.average_tokens_across_devices else 1
        loss = batching.normalise_loss(loss, self.current_gradient_accumulation_steps, by_items, world_scale)
        self._backend.backward(loss)
        return loss.detach()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The model's loss, or label smoothing / compute_loss_func applied to its outputs (modeling.compute_loss)."""
        try:
            loss, outputs = modeling.compute_loss(
                model, inputs, num_items_in_batch, label_smoother=self.label_smoother, compute_loss_func=self.compute_loss_func,
                accepts_loss_kwargs=self.model_accepts_loss_kwargs, shifts_labels=self._loss_shifts_labels)
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

    def floating_point_ops(self, inputs) -> int:
        """Operations of one forward + backward pass over `inputs` (modeling.FlopsEstimate), for total_flos."""
        if not isinstance(inputs, Mapping):
            return 0
        estimate = self._flops_estimate
        if estimate is None or estimate.model is not self.model:
            estimate = self._flops_estimate = modeling.FlopsEstimate(self.model)
        return estimate(inputs)

    # ----- optimizer and scheduler (optim.py, schedules.py) -----

    def get_decay_parameter_names(self, model) -> list[str]:
        from lathe.train.optim import get_decay_parameter_names

        return get_decay_parameter_names(model)

    def create_optimizer(self, model=None):
        from lathe.train.optim import create_optimizer

        if self.optimizer is None:
            self.optimizer = create_optimizer(model or self.model, self.args, self.optimizer_cls_and_kwargs)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        from lathe.train.optim import get_scheduler

        if self.lr_scheduler is None:
            self.lr_scheduler = get_scheduler(
                self.args.lr_scheduler_type, optimizer=optimizer or self.optimizer,
                num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
                num_training_steps=num_training_steps, scheduler_specific_kwargs=self.args.lr_scheduler_kwargs,
            )
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps, optimizer=self.optimizer)

    def _get_learning_rate(self) -> float:
        if isinstance(self.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            return self.optimizer.param_groups[0]["lr"]
        return self.lr_scheduler.get_last_lr()[0]

    # ----- data (loaders.py) -----

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs a train_dataset.")
        return loaders.build_dataloader(self, self.train_dataset, "training", self._train_batch_size, train=True)

    def get_eval_dataloader(self, eval_dataset=None):
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        eval_dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if eval_dataset is None:
            raise ValueError("Evaluation needs an eval_dataset (pass it to Trainer or to evaluate()).")
        return loaders.build_dataloader(self, eval_dataset, "evaluation", self.args.eval_batch_size, train=False)

    def get_test_dataloader(self, test_dataset):
        return loaders.build_dataloader(self, test_dataset, "test", self.args.eval_batch_size, train=False)

    def num_examples(self, dataloader) -> int:
        return loaders.num_examples(dataloader, self.args.per_device_train_batch_size)

    def num_tokens(self, dataloader, max_steps: int | None = None) -> int:
        return loaders.num_tokens(dataloader, self.main_input_name, max_steps)

    # ----- evaluation and prediction (predicting.py, evaluation.py) -----

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Metrics prefixed with `metric_key_prefix`; a dict of eval datasets gives `eval_<name>_*`."""
        return predicting.evaluate(self, eval_dataset, ignore_keys, metric_key_prefix)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test"):
        return predicting.predict(self, test_dataset, ignore_keys, metric_key_prefix)

    def evaluation_loop(self, dataloader, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys=None, metric_key_prefix: str = "eval"):
        return predicting.evaluation_loop(self, dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None):
        """(loss, logits, labels) for one batch; loss is None when the batch has no labels."""
        return predicting.prediction_step(self, model, inputs, prediction_loss_only, ignore_keys)

    def _evaluate(self, trial, ignore_keys_for_eval, skip_scheduler: bool = False) -> dict:
        return predicting.evaluate_during_training(self, trial, ignore_keys_for_eval, skip_scheduler)

    # ----- checkpoints and results (resume.py) -----

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        resume.save_model(self, output_dir, _internal_call)

    def _save_checkpoint(self, model, trial) -> None:
        resume.save_checkpoint(self, model, save_model_overridden=type(self).save_model is not Trainer.save_model)

    def _best_checkpoint_path(self) -> str | None:
        return resume.find_best_checkpoint(self.state.best_model_checkpoint, self.args.output_dir)

    def save_state(self) -> None:
        resume.save_state(self.args, self.state)

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        resume.save_metrics(self.args, split, metrics, combined)

    @staticmethod
    def metrics_format(metrics: dict) -> dict:
        return resume.metrics_format(metrics)

    def log_metrics(self, split: str, metrics: dict) -> None:
        if self.is_world_process_zero():
            resume.print_metrics(split, self.metrics_format(metrics))


def _length(obj) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None
