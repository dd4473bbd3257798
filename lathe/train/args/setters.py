"""The fluent set_* methods of TrainingArguments: transformers' grouped setters, each returning self."""

import warnings

from lathe.train.args.enums import IntervalStrategy, OptimizerNames, SaveStrategy, SchedulerType, to_enum
from lathe.train.args.validation import LOG_LEVELS, normalize_report_to


class FluentSetters:
    """Mixed into TrainingArguments. Like transformers, a setter does not re-run the whole validation;
    it checks the values it sets (enum names, a zero step interval, reporter names)."""

    def set_training(
        self,
        learning_rate: float = 5e-5,
        batch_size: int = 8,
        weight_decay: float = 0,
        num_epochs: float = 3,
        max_steps: int = -1,
        gradient_accumulation_steps: int = 1,
        seed: int = 42,
        activation_checkpointing: bool = False,
        gradient_checkpointing: bool | None = None,
    ):
        """Set the basic training options and `do_train=True`."""
        if gradient_checkpointing is not None:
            warnings.warn(
                "`gradient_checkpointing` is deprecated; use `activation_checkpointing`.", FutureWarning, stacklevel=2
            )
            activation_checkpointing = gradient_checkpointing
        self.do_train = True
        self.learning_rate = learning_rate
        self.per_device_train_batch_size = batch_size
        self.weight_decay = weight_decay
        self.num_train_epochs = num_epochs
        self.max_steps = max_steps
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.seed = seed
        self.activation_checkpointing = self.gradient_checkpointing = activation_checkpointing
        return self

    def set_evaluate(
        self,
        strategy: str | IntervalStrategy = "no",
        steps: int = 500,
        batch_size: int = 8,
        accumulation_steps: int | None = None,
        delay: float | None = None,
        loss_only: bool = False,
    ):
        """Set the evaluation options; a strategy other than 'no' also sets `do_eval`."""
        self.eval_strategy = to_enum(IntervalStrategy, strategy, "eval_strategy")
        if self.eval_strategy == IntervalStrategy.STEPS and steps == 0:
            raise ValueError("set_evaluate: strategy='steps' needs a positive `steps`.")
        self.do_eval = self.eval_strategy != IntervalStrategy.NO
        self.eval_steps = steps
        self.per_device_eval_batch_size = batch_size
        self.eval_accumulation_steps = accumulation_steps
        # transformers stores None here, which later comparisons cannot use; None means "no delay".
        self.eval_delay = 0 if delay is None else delay
        self.prediction_loss_only = loss_only
        return self

    def set_testing(self, batch_size: int = 8, loss_only: bool = False):
        """Set the prediction options and `do_predict=True`."""
        self.do_predict = True
        self.per_device_eval_batch_size = batch_size
        self.prediction_loss_only = loss_only
        return self

    def set_save(
        self,
        strategy: str | SaveStrategy = "steps",
        steps: int = 500,
        total_limit: int | None = None,
        on_each_node: bool = False,
    ):
        """Set the checkpoint options."""
        self.save_strategy = to_enum(SaveStrategy, strategy, "save_strategy")
        if self.save_strategy == SaveStrategy.STEPS and steps == 0:
            raise ValueError("set_save: strategy='steps' needs a positive `steps`.")
        self.save_steps = steps
        self.save_total_limit = total_limit
        self.save_on_each_node = on_each_node
        return self

    def set_logging(
        self,
        strategy: str | IntervalStrategy = "steps",
        steps: int = 500,
        report_to: str | list[str] = "none",
        level: str = "passive",
        first_step: bool = False,
        nan_inf_filter: bool = False,
        on_each_node: bool = False,
        replica_level: str = "passive",
    ):
        """Set the logging options (the defaults are transformers' setter defaults, not the field defaults)."""
        self.logging_strategy = to_enum(IntervalStrategy, strategy, "logging_strategy")
        if self.logging_strategy == IntervalStrategy.STEPS and steps == 0:
            raise ValueError("set_logging: strategy='steps' needs a positive `steps`.")
        for name, value in (("log_level", level), ("log_level_replica", replica_level)):
            if value not in LOG_LEVELS:
                raise ValueError(f"{name}={value!r} is not valid; choose one of {list(LOG_LEVELS)}")
        self.logging_steps = steps
        self.report_to = normalize_report_to(report_to)
        self.log_level = level
        self.logging_first_step = first_step
        self.logging_nan_inf_filter = nan_inf_filter
        self.log_on_each_node = on_each_node
        self.log_level_replica = replica_level
        return self

    def set_optimizer(
        self,
        name: str | OptimizerNames = "adamw_torch",
        learning_rate: float = 5e-5,
        weight_decay: float = 0,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        args: str | None = None,
    ):
        """Set the optimizer and its hyperparameters."""
        self.optim = to_enum(OptimizerNames, name, "optim")
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.adam_beta1 = beta1
        self.adam_beta2 = beta2
        self.adam_epsilon = epsilon
        self.optim_args = args
        return self

    def set_lr_scheduler(
        self,
        name: str | SchedulerType = "linear",
        num_epochs: float = 3.0,
        max_steps: int = -1,
        warmup_steps: float = 0,
    ):
        """Set the learning-rate schedule and the training length it spans."""
        self.lr_scheduler_type = to_enum(SchedulerType, name, "lr_scheduler_type")
        self.num_train_epochs = num_epochs
        self.max_steps = max_steps
        self.warmup_steps = warmup_steps
        return self

    def set_dataloader(
        self,
        train_batch_size: int = 8,
        eval_batch_size: int = 8,
        drop_last: bool = False,
        num_workers: int = 0,
        pin_memory: bool = True,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: str | None = None,
        in_order: bool = True,
        auto_find_batch_size: bool = False,
        ignore_data_skip: bool = False,
        sampler_seed: int | None = None,
    ):
        """Set the data-loading options."""
        self.per_device_train_batch_size = train_batch_size
        self.per_device_eval_batch_size = eval_batch_size
        self.dataloader_drop_last = drop_last
        self.dataloader_num_workers = num_workers
        self.dataloader_pin_memory = pin_memory
        self.dataloader_persistent_workers = persistent_workers
        self.dataloader_prefetch_factor = prefetch_factor
        self.dataloader_multiprocessing_context = multiprocessing_context
        self.dataloader_in_order = in_order
        self.auto_find_batch_size = auto_find_batch_size
        self.ignore_data_skip = ignore_data_skip
        self.data_seed = sampler_seed
        return self
