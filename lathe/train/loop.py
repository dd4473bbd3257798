"""The training loop that Trainer.train() runs: training_loop (epochs of update steps) and update_step (one
optimizer update), each readable top to bottom, in transformers' event order. They call the Trainer's
override points (training_step, log, _maybe_log_save_evaluate, get_train_dataloader, ...) on the trainer
they are given, and its back-end (stepping.py) for everything a back-end does differently."""

from __future__ import annotations

import logging

import torch

from lathe.train import batching, resume, runtime, saving, seed, stepping
from lathe.train.data import epochs as data
from lathe.train.evaluation.outputs import TrainOutput
from lathe.train.features import hp_search
from lathe.train.parallel import distributed, nodes
from lathe.train.run import TrainingRun
from lathe.train.state import TrainerState

logger = logging.getLogger("lathe.train.trainer")  # the Trainer's logger, whose name users filter on


def training_loop(trainer, batch_size: int, resume_path: str | None, trial, ignore_keys_for_eval) -> TrainOutput:
    """Epochs of update steps: train_begin, then per epoch epoch_begin, the updates (each followed by
    the Trainer acting on the flags the callbacks set), epoch_end; then the final log and train_end."""
    args = trainer.args
    trainer.is_in_train = True
    trainer._train_batch_size = batch_size
    train_dataloader = trainer.get_train_dataloader()
    batches = _length(train_dataloader)
    # num_examples: len(loader.dataset), or an estimate for a loader without one (a get_train_dataloader override).
    plan = batching.plan_training(
        args, batches, trainer.num_examples(train_dataloader) if batches else None, batch_size
    )
    model = prepare_for_training(trainer, plan)
    trainer.state = new_state(trainer, batch_size, plan, trial)
    rng_state = None
    if resume_path is not None:  # after the optimizer, scheduler and engine exist: their states load into them
        trainer.state, rng_state = resume.load_checkpoint(trainer, resume_path, plan)
    start = batching.resume_position(
        trainer.state.global_step, plan, args.gradient_accumulation_steps, args.ignore_data_skip, trainer.state.epoch
    )
    log_training_summary(trainer, plan, train_dataloader, resume_path, start)
    begin_run(trainer, model, train_dataloader)
    # Every submodule in training mode, as transformers' training_step makes it: a model assembled from parts
    # loaded with from_pretrained (in eval mode) under a new top-level module (sentence-transformers) says
    # training=True at the top, so training_step's check alone would leave their dropout off.
    model.train()
    trainer.control = trainer.callback_handler.on_train_begin(args, trainer.state, trainer.control)
    if args.eval_on_start:  # a baseline metric; ReduceLROnPlateau must not count it as an epoch's result
        trainer._evaluate(trial, ignore_keys_for_eval, skip_scheduler=True)
    for epoch in range(start.epoch, plan.num_train_epochs):
        # The resumed epoch skips what the interrupted run trained on and restores its RNG (data.epoch_batches says where).
        skip, rng = (start.batches_to_skip, rng_state) if epoch == start.epoch else (0, None)
        trainer._run.batches_done_in_epoch = skip
        trainer.control = trainer.callback_handler.on_epoch_begin(args, trainer.state, trainer.control)
        epoch_batches = data.epoch_batches(train_dataloader, epoch, skip, rng)
        first_update = start.updates_done_in_epoch if epoch == start.epoch else 0
        steps_before = trainer.state.global_step
        for window in batching.update_windows(epoch_batches, plan, args.gradient_accumulation_steps, first_update):
            if rng is not None and skip:  # after the first update's batches are read, as transformers
                seed.restore_rng_state(rng)
                rng = None
            update_step(trainer, model, window, epoch, plan)
            trainer._maybe_log_save_evaluate(model, trial, ignore_keys_for_eval)
            if trainer.control.should_epoch_stop or trainer.control.should_training_stop:
                break
        if trainer.state.global_step == steps_before and not trainer.control.should_training_stop:
            stop_on_empty_pass(trainer, epoch)
        trainer.control = trainer.callback_handler.on_epoch_end(args, trainer.state, trainer.control)
        trainer._maybe_log_save_evaluate(model, trial, ignore_keys_for_eval)  # the "epoch" strategies act here
        if trainer.control.should_training_stop or trainer.state.global_step >= plan.max_steps:
            break
    return finish_run(trainer)


def update_step(trainer, model, window: list, epoch: int, plan) -> None:
    """One optimizer update over an accumulation window of micro-batches."""
    args, state, run, backend, events = (
        trainer.args,
        trainer.state,
        trainer._run,
        trainer._backend,
        trainer.callback_handler,
    )
    trainer.control = events.on_step_begin(args, state, trainer.control)
    # the loss denominator: the label tokens of the whole window (summed over ranks when asked)
    num_items = batching.count_window_items(
        window, trainer._counts_items(), trainer._loss_shifts_labels, args.device, args.average_tokens_across_devices
    )
    trainer.current_gradient_accumulation_steps = len(window)  # or, without a count, the window's size
    accelerator = trainer.__dict__.get("_accelerator")  # trainer.accelerator, once something asked for it
    for index, inputs in enumerate(window):
        is_last = index == len(window) - 1
        if accelerator is not None:  # accelerator.sync_gradients, as transformers' loop sets it
            accelerator.gradient_state.sync_gradients = is_last
        # Gradients are summed locally and reduced across ranks once, on the window's last backward.
        with backend.gradient_sync(is_last):
            loss = trainer.training_step(model, inputs, num_items)  # forward (compute_loss), then backward
        tally_micro_batch(trainer, inputs, loss)
        if not is_last:
            trainer.control = events.on_substep_end(args, state, trainer.control)
    # Clipped before on_pre_optimizer_step (transformers' order); the logged grad_norm is the norm before clipping.
    backend.clip_gradients(args.max_grad_norm)
    trainer.control = events.on_pre_optimizer_step(args, state, trainer.control)
    run.learning_rate = trainer._get_learning_rate()  # the rate this update uses: read before the scheduler moves it
    updated = backend.optimizer_step()  # False after an fp16 overflow: no update, so no schedule step either
    trainer.control = events.on_optimizer_step(args, state, trainer.control)  # gradients still there to inspect
    if updated:
        backend.scheduler_step()
    backend.zero_grad()
    state.global_step += 1
    run.batches_done_in_epoch += len(window)
    # Iterable datasets have no epoch length; like transformers, count max_steps windows as one.
    batches_per_epoch = plan.batches_per_epoch or plan.max_steps * args.gradient_accumulation_steps
    state.epoch = epoch + run.batches_done_in_epoch / batches_per_epoch
    trainer.control = events.on_step_end(args, state, trainer.control)  # the flow callback decides log/eval/save here


def tally_micro_batch(trainer, inputs, loss: torch.Tensor) -> None:
    """The micro-batch's share of the logged loss, of total_flos and of num_input_tokens_seen."""
    run, args, state = trainer._run, trainer.args, trainer.state
    run.losses.add(loss, state.global_step - run.step_last_logged)
    trainer.current_flos += float(trainer.floating_point_ops(inputs))
    if args.include_num_input_tokens_seen != "no":
        state.num_input_tokens_seen += batching.count_input_tokens(
            inputs, args.include_num_input_tokens_seen, trainer.main_input_name
        )


def stop_on_empty_pass(trainer, epoch: int) -> None:
    """A pass over the data gave no batch (an exhausted or empty iterable dataset): stop rather
    than loop forever waiting for max_steps."""
    logger.warning(
        "Pass %d over the training data yielded no batch, so training stops at step %d of %d. An iterable "
        "dataset must be re-iterable (a generator is used up after one pass) and yield at least one batch.",
        epoch,
        trainer.state.global_step,
        trainer.state.max_steps,
    )
    trainer.control.should_training_stop = True


def prepare_for_training(trainer, plan):
    """Gradient checkpointing, DDP / FSDP2 / torch.compile wrapping, optimizer and scheduler, then
    DeepSpeed's engine around them when configured, and the fp16 GradScaler. Returns the model to train."""
    args = trainer.args
    if args.gradient_checkpointing:
        runtime.enable_gradient_checkpointing(trainer.model, args.gradient_checkpointing_kwargs)
    nodes.check_separate_disks(args)  # save_on_each_node on a disk the nodes share is a race
    wrapped = distributed.wrap_model(trainer.model, args)  # DDP under several processes
    model = trainer.model_wrapped = runtime.compile_model(wrapped, args) if args.torch_compile else wrapped
    if trainer._created_lr_scheduler:  # a second train() keeps the optimizer (and its state), not the spent schedule
        trainer.lr_scheduler, trainer._created_lr_scheduler = None, False
    trainer.create_optimizer_and_scheduler(plan.max_steps)
    trainer._zero_engine = None
    if args.deepspeed:
        from lathe.train.parallel import deepspeed_zero

        trainer.floating_point_ops({})  # counts the parameters (for total_flos) before ZeRO-3 partitions them
        engine = deepspeed_zero.initialize(model, trainer.optimizer, trainer.lr_scheduler, args)
        model = trainer._zero_engine = trainer.model_wrapped = engine
        trainer.optimizer, trainer.lr_scheduler = engine.optimizer, engine.lr_scheduler
    trainer.scaler = runtime.make_grad_scaler(args, args.device)
    return model


def new_state(trainer, batch_size: int, plan, trial) -> TrainerState:
    state = TrainerState(train_batch_size=batch_size, stateful_callbacks=saving.stateful_callbacks(trainer))
    state.compute_steps(trainer.args, plan.max_steps)
    state.init_training_references(trainer, plan.max_steps, plan.num_train_epochs, trial)
    state.trial_name, state.trial_params = hp_search.trial_references(trainer, trial)
    return state


def log_training_summary(trainer, plan, train_dataloader, resume_path, start) -> None:
    """transformers' "***** Running training *****" block at info level, line for line."""
    args, batch_size = trainer.args, trainer._train_batch_size
    if plan.batches_per_epoch:
        examples = trainer.num_examples(train_dataloader)
    else:
        examples = batch_size * args.gradient_accumulation_steps * args.world_size * plan.max_steps
    total_batch = batch_size * args.gradient_accumulation_steps * args.world_size
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {examples:,}")
    logger.info(f"  Num Epochs = {plan.num_train_epochs:,}")
    logger.info(f"  Num update steps per epoch = {plan.updates_per_epoch or plan.max_steps:,}")
    logger.info(f"  Instantaneous batch size per device = {args.per_device_train_batch_size:,}")
    if args.per_device_train_batch_size != batch_size:
        logger.info(f"  Training with DataParallel so batch size has been adjusted to: {batch_size:,}")
    logger.info(f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch:,}")
    logger.info(f"  Gradient Accumulation steps = {args.gradient_accumulation_steps}")
    logger.info(f"  Total optimization steps = {plan.max_steps:,}")
    logger.info(f"  Number of trainable parameters = {trainable:,}")
    if resume_path is not None:
        logger.info(
            f"  Resuming training from checkpoint with epoch {start.epoch} and global step {trainer.state.global_step}"
        )
        if not args.ignore_data_skip:
            logger.info(
                f"  Fast-forwarding the dataloader past {start.epoch} epochs and {start.batches_to_skip}"
                " batches to resume from the exact training state."
            )


def begin_run(trainer, model, train_dataloader) -> None:
    """Hand the run's objects to the callbacks, choose the back-end, start the tally."""
    handler = trainer.callback_handler
    handler.model, handler.optimizer, handler.lr_scheduler = trainer.model, trainer.optimizer, trainer.lr_scheduler
    handler.train_dataloader = train_dataloader
    parameters = list(trainer.model.parameters())
    trainer._backend = stepping.choose_backend(
        model, parameters, trainer.optimizer, trainer.lr_scheduler, trainer.scaler, trainer._zero_engine
    )
    trainer._run = TrainingRun.start(trainer.state, trainer.args)
    trainer.model.zero_grad(set_to_none=True)


def finish_run(trainer) -> TrainOutput:
    """Publish the checkpoints, reload the best model if asked, log the run's metrics, call train_end."""
    from lathe.train.evaluation.loop import speed_metrics

    args, state, run = trainer.args, trainer.state, trainer._run
    trainer._checkpoint_commits.wait()  # every checkpoint is published before train() returns
    train_loss = run.train_loss(state.global_step, args.device)
    if run.losses.nonfinite:
        logger.warning(
            "%d micro-batches had a non-finite loss; the logged loss counts them as the running mean (logging_nan_inf_filter).",
            run.losses.nonfinite,
        )
    if args.load_best_model_at_end and state.best_model_checkpoint is not None:
        trainer._load_best_model()  # transformers' hook (resume.load_best_model unless a subclass overrides it)
    steps_run = run.steps_run(state.global_step)
    samples_run = (
        steps_run * trainer._train_batch_size * args.gradient_accumulation_steps * args.world_size
    )  # all ranks, as transformers
    metrics = speed_metrics("train", run.start_time, num_samples=samples_run, num_steps=steps_run)
    trainer.store_flos()
    metrics["total_flos"] = state.total_flos
    metrics["train_loss"] = train_loss
    trainer._memory_tracker.stop_and_update_metrics(metrics, stage="train")  # skip_memory_metrics=False
    trainer.is_in_train = False
    trainer.log(metrics)
    saving.final_rotation(args, trainer._best_checkpoint_path())
    trainer.control = trainer.callback_handler.on_train_end(args, state, trainer.control)
    return TrainOutput(state.global_step, train_loss, metrics)


def _length(obj) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None
