"""The types of TrainingArguments' Hub, debug, accelerate, kernel and tracker fields (transformers' names),
the properties that describe accelerate's set-up, and the checks that turn what cannot run here into an
error at TrainingArguments(). The fields themselves are in training_args.py's table."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from lathe.train.args.enums import ExplicitEnum, to_enum


class HubStrategy(ExplicitEnum):
    END = "end"
    EVERY_SAVE = "every_save"
    CHECKPOINT = "checkpoint"
    ALL_CHECKPOINTS = "all_checkpoints"


class ParallelMode(ExplicitEnum):
    NOT_PARALLEL = "not_parallel"
    NOT_DISTRIBUTED = "not_distributed"
    DISTRIBUTED = "distributed"
    SAGEMAKER_MODEL_PARALLEL = "sagemaker_model_parallel"
    SAGEMAKER_DATA_PARALLEL = "sagemaker_data_parallel"
    TPU = "tpu"


class DebugOption(ExplicitEnum):
    UNDERFLOW_OVERFLOW = "underflow_overflow"
    TPU_METRICS_DEBUG = "tpu_metrics_debug"


@dataclass
class AcceleratorConfig:
    """transformers' `accelerator_config`: how accelerate would split, dispatch and accumulate. lathe's loop
    does what the defaults describe, and in one process what split_batches / dispatch_batches / even_batches
    describe too; non_blocking (lathe's batch copies are non-blocking anyway) and use_configured_state (lathe
    uses the process group that is set up) hold as given; `gradient_accumulation_kwargs["num_steps"]` sets gradient_accumulation_steps as in
    transformers; other values are refused by `check_accelerator_config`."""

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = True
    non_blocking: bool = False
    gradient_accumulation_kwargs: dict | None = None
    use_configured_state: bool = False

    @classmethod
    def from_json_file(cls, json_file: str) -> AcceleratorConfig:
        with open(json_file, encoding="utf-8") as handle:
            return cls(**json.load(handle))

    def to_dict(self) -> dict[str, Any]:
        # as transformers: use_configured_state is a run-time switch, not saved with the arguments
        return {key: value for key, value in dataclasses.asdict(self).items() if key != "use_configured_state"}

    def pop(self, key: str, default=None):
        return self.__dict__.pop(key, default)


class IntegrationProperties:
    """transformers' TrainingArguments attributes that describe accelerate's set-up, as lathe's loop runs."""

    default_optim = "adamw_torch_fused"  # transformers' default since torch 2.8 (lathe needs newer)
    is_torch_greater_or_equal_than_2_8 = True
    deepspeed_plugin = None  # lathe's DeepSpeed engine is configured from `deepspeed`, without accelerate

    @property
    def distributed_state(self):
        """accelerate's PartialState as transformers keeps it here: lathe's answer from its own process group."""
        from lathe.train.accelerator import ProcessState

        return ProcessState(self)

    @property
    def parallel_mode(self) -> ParallelMode:
        if self.world_size > 1:
            return ParallelMode.DISTRIBUTED
        return ParallelMode.NOT_DISTRIBUTED if self.n_gpu > 1 else ParallelMode.NOT_PARALLEL

    @property
    def place_model_on_device(self) -> bool:
        return True  # no SageMaker model parallelism

    @property
    def mixed_precision(self) -> str:
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "no"

    @property
    def fsdp_plugin_args(self) -> dict | None:
        return dict(self.fsdp_config or {}) if self.fsdp else None

    def set_push_to_hub(
        self,
        model_id: str,
        strategy: str = "every_save",
        token=None,
        private_repo=None,
        always_push: bool = False,
        revision=None,
    ):
        raise ValueError("push_to_hub is not supported: lathe works offline. Copy output_dir to the Hub yourself.")


def check_integration_fields(args) -> None:
    """Convert and check the Hub, debug, accelerate, kernel and tracker fields (TrainingArguments.__post_init__)."""
    args.hub_strategy = to_enum(HubStrategy, args.hub_strategy, "hub_strategy")
    args.debug = _debug_options(args.debug)
    if DebugOption.TPU_METRICS_DEBUG in args.debug:
        raise ValueError("debug='tpu_metrics_debug' prints torch_xla metrics; lathe has no TPU (XLA) back-end.")
    check_accelerator_config(args)
    if args.parallelism_config is not None:
        raise ValueError(
            "parallelism_config (accelerate's tensor / context / sequence parallelism) is not supported: lathe "
            "runs data parallelism (DDP), FSDP (fsdp=...) or DeepSpeed (deepspeed=...) through torchrun."
        )
    _check_liger(args)
    for name in ("trackio_space_id", "trackio_bucket_id", "trackio_static_space_id"):
        if getattr(args, name) not in (None, False):
            raise ValueError(
                f"{name}={getattr(args, name)!r} needs the Hugging Face Hub; lathe works offline and trackio "
                "logs to its local database (report_to='trackio', project=...)."
            )
    if not isinstance(args.project, str) or not args.project:
        raise ValueError(f"project must be a non-empty string, got {args.project!r}")


def _debug_options(value) -> list[DebugOption]:
    if value is None:
        return []
    names = value.split() if isinstance(value, str) else list(value)
    return [to_enum(DebugOption, name, "debug") for name in names]


def _check_liger(args) -> None:
    if not isinstance(args.use_liger_kernel, bool):
        raise TypeError(f"use_liger_kernel must be a bool, got {args.use_liger_kernel!r}")
    config = args.liger_kernel_config
    if isinstance(config, str):
        config = args.liger_kernel_config = json_object("liger_kernel_config", config)
    if config is not None and (
        not isinstance(config, dict) or not all(isinstance(k, str) and isinstance(v, bool) for k, v in config.items())
    ):
        raise ValueError(f"liger_kernel_config must map kernel names to True/False, got {config!r}")


def json_object(name: str, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{name}: not valid JSON ({error}): {text!r}") from None


def check_accelerator_config(args) -> None:
    """Make `accelerator_config` an AcceleratorConfig; refuse what lathe's loop does not do."""
    value = args.accelerator_config
    if value is None:
        value = AcceleratorConfig()
    elif isinstance(value, str) and value.lstrip().startswith("{"):
        value = json_object("accelerator_config", value)
    elif isinstance(value, str):
        if not os.path.isfile(value):
            raise ValueError(f"accelerator_config={value!r}: expected a dict, a JSON object string or a JSON file path")
        value = AcceleratorConfig.from_json_file(value)
    if isinstance(value, dict):
        names = [f.name for f in dataclasses.fields(AcceleratorConfig)]
        unknown = [key for key in value if key not in names]
        if unknown:
            raise ValueError(f"accelerator_config has unknown keys {unknown}; the keys are {names}")
        value = AcceleratorConfig(**{key: _cli_bool(item) for key, item in value.items()})
    if not isinstance(value, AcceleratorConfig):
        raise ValueError(f"accelerator_config must be a dict, a JSON string or a file path, got {value!r}")
    args.accelerator_config = value
    # non_blocking: lathe's batches already move with non_blocking=True (pinned memory makes it asynchronous);
    # use_configured_state: lathe never resets a process group set up before the arguments, it uses it.
    refused = {"use_seedable_sampler": False}
    # how accelerate shares batches between processes: the same thing as the default in one process
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        refused.update(split_batches=True, even_batches=False)
        if value.dispatch_batches is not None:
            raise ValueError(
                "accelerator_config dispatch_batches is not supported: every lathe process loads its own batches."
            )
    for name, bad in refused.items():
        if getattr(value, name) == bad:
            raise ValueError(f"accelerator_config {name}={bad} is not supported by lathe's loop (no accelerate).")
    _apply_accumulation_kwargs(args, dict(value.gradient_accumulation_kwargs or {}))


def _apply_accumulation_kwargs(args, kwargs: dict) -> None:
    steps = kwargs.pop("num_steps", None)
    if kwargs.pop("sync_with_dataloader", True) is not True or kwargs.pop("sync_each_batch", False) is not False:
        raise ValueError("accelerator_config gradient_accumulation_kwargs: only num_steps is supported by lathe.")
    if kwargs:
        raise ValueError(f"accelerator_config gradient_accumulation_kwargs has unknown keys {sorted(kwargs)}")
    if steps is None:
        return
    if args.gradient_accumulation_steps not in (1, steps):
        raise ValueError(
            "accelerator_config's gradient_accumulation_kwargs num_steps and gradient_accumulation_steps "
            "are both set: set only one of them."
        )
    args.gradient_accumulation_steps = int(steps)  # as transformers: num_steps sets the accumulation


def _cli_bool(value):
    # from the command line every value is a string: "True" means True (as transformers reads it)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value
