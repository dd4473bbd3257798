"""The pieces of one optimizer update, mixed into Trainer: forward and backward of a micro-batch
(training_step, compute_loss: the documented override points), the optimizer step (clip, step,
schedule, zero) and creating the optimizer and scheduler. The loop that calls them is trainer.py."""
from __future__ import annotations

from collections.abc import Mapping

import torch

from lathe.train import batching, modeling, runtime


class TrainerSteps:
    """Mixed into Trainer; reads self.args, self.model, self.optimizer, self.lr_scheduler, ..."""

    # ----- optimisation -----

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


    # ----- one update -----

    def _optimizer_step(self, model) -> None:
        """Clip (pre-clip norm is what gets logged), step, schedule, zero. The learning rate logged
        for a step is the one that step used, read before the scheduler moves it."""
        args = self.args
        if self._zero_engine is not None:
            return self._zero_engine_step()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self._optimizer_flips_requires_grad:  # BAdam trains one block at a time: clip what trains now
            self._trainable_parameters = [p for p in self._all_parameters if p.requires_grad]
        self._grad_norm = runtime.clip_gradients(self._trainable_parameters, args.max_grad_norm, self._sparse_gradients) if args.max_grad_norm and args.max_grad_norm > 0 else None
        self.control = self.callback_handler.on_pre_optimizer_step(args, self.state, self.control)
        if self.scaler is not None:
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            step_skipped = self.scaler.get_scale() < scale_before  # inf/nan gradients: no update happened
        else:
            self.optimizer.step()
            step_skipped = False
        self.control = self.callback_handler.on_optimizer_step(args, self.state, self.control)
        self._last_learning_rate = self._get_learning_rate()
        if not step_skipped and not isinstance(self.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.lr_scheduler.step()
        runtime.clear_gradients(self._all_parameters)

    def _zero_engine_step(self) -> None:
        """DeepSpeed's engine clips (gradient_clipping), steps the partitioned optimizer and the
        scheduler (not after an fp16 overflow), and zeroes the gradients."""
        from lathe.train.integrations import deepspeed_zero

        self.control = self.callback_handler.on_pre_optimizer_step(self.args, self.state, self.control)
        self._last_learning_rate = self._get_learning_rate()
        self._grad_norm = deepspeed_zero.step(self._zero_engine)
        self.control = self.callback_handler.on_optimizer_step(self.args, self.state, self.control)

    def _counts_items(self) -> bool:
        # Label smoothing divides by the count too (as in transformers 5), when the model takes loss kwargs.
        return self.model_accepts_loss_kwargs or self.compute_loss_func is not None

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """Forward and backward for one micro-batch; returns the detached, normalised loss."""
        if not model.training:  # model.train() walks every module; evaluation is what turns it off
            model.train()
        inputs = self._prepare_inputs(inputs)
        with runtime.autocast_context(self.args.device, self._autocast_dtype):
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        normalised_by_items = num_items_in_batch is not None and self._counts_items()
        loss = batching.normalise_loss(loss, self.current_gradient_accumulation_steps, normalised_by_items,
                                       getattr(self, "_loss_world_scale", 1))
        if getattr(self, "_zero_engine", None) is not None:
            from lathe.train.integrations import deepspeed_zero

            deepspeed_zero.backward(self._zero_engine, loss)
        else:
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss.detach()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The model's loss, or label smoothing / compute_loss_func applied to its outputs."""
        try:
            return self._compute_loss(model, inputs, return_outputs, num_items_in_batch)
        except (RuntimeError, ValueError) as error:
            explained = modeling.explain_label_error(error, inputs, self.label_names)
            if explained is None:
                raise
            raise explained from error

    def _compute_loss(self, model, inputs, return_outputs, num_items_in_batch):
        labels = None
        if (self.label_smoother is not None or self.compute_loss_func is not None) and isinstance(inputs, Mapping) and "labels" in inputs:
            inputs = dict(inputs)
            labels = inputs.pop("labels")
        if isinstance(inputs, Mapping):
            if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
                inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
            outputs = model(**inputs)
        else:
            outputs = model(*inputs)
        if labels is not None:
            if self.compute_loss_func is not None:
                loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
            else:
                loss = self.label_smoother(outputs, labels, shift_labels=self._loss_shifts_labels, num_items_in_batch=num_items_in_batch)
        else:
            loss = modeling.loss_from_outputs(outputs, inputs)
        return (loss, outputs) if return_outputs else loss

    def _prepare_inputs(self, inputs):
        if isinstance(inputs, Mapping) and len(inputs) == 0:
            raise ValueError(
                "A batch reached the model empty: no dataset column matches the model's forward arguments "
                f"({', '.join(self._signature_columns())}). Rename the columns or set remove_unused_columns=False."
            )
        return runtime.move_to_device(inputs, self.args.device)

    def floating_point_ops(self, inputs) -> int:
        """transformers 5's estimate, 6 x input positions x non-embedding parameters, for models with
        num_parameters (its PreTrainedModel no longer has floating_point_ops, so asking the model
        gave 0 for every transformers model); else the model's own floating_point_ops, if any."""
        if not isinstance(inputs, Mapping):
            return 0
        model = self.model
        # What to count with, looked up once per model: counting parameters walks every module
        # (~0.7 ms for a small LM) and a missing attribute of an nn.Module costs a raised error.
        facts = getattr(self, "_flops_facts", None)
        if facts is None or facts[0] is not model:
            count = model.num_parameters(exclude_embeddings=True) if hasattr(model, "num_parameters") else None
            facts = self._flops_facts = (model, getattr(model, "main_input_name", "input_ids"), count,
                                         getattr(model, "floating_point_ops", None))
        _, main_input, count, counter = facts
        if count is not None and main_input in inputs:
            return 6 * inputs[main_input].numel() * count
        return counter(inputs) if counter is not None else 0

    def _get_learning_rate(self) -> float:
        if isinstance(self.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            return self.optimizer.param_groups[0]["lr"]
        return self.lr_scheduler.get_last_lr()[0]

    @property
    def _autocast_dtype(self):
        return runtime.autocast_dtype(self.args)
