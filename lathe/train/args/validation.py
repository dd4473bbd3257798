"""TrainingArguments.__post_init__: deprecated names, defaults that depend on other fields, and checks."""

import json
import logging
import math
import os
from dataclasses import fields

from lathe.train.args.coercion import coerce_field_types
from lathe.train.args.deprecated import map_deprecated_names, warn_from_user_code, yaml_no
from lathe.train.args.enums import IntervalStrategy, OptimizerNames, SaveStrategy, SchedulerType, to_enum
from lathe.train.args.integrations import check_integration_fields
from lathe.train.callbacks.reporters import REPORTERS, available_reporters, with_kubeflow

# Python logging levels by name; "passive" (-1) leaves the level the application set.
LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50, "passive": -1}

# Reporter names `report_to` accepts; the reporter module builds one callback per name.
SUPPORTED_REPORTERS = tuple(REPORTERS)

_TOKENS_SEEN_CHOICES = ("no", "all", "non_padding")
_METRIC_INPUTS = ("inputs", "loss")

# Fields that take a dict; on the command line they arrive as a JSON object string.
_DICT_FIELDS = (
    "lr_scheduler_kwargs",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing_kwargs",
    "fsdp_config",
    "deepspeed",
)
# Of those, these may also name a JSON file, which the FSDP / DeepSpeed set-up reads later.
_DICT_OR_PATH_FIELDS = ("fsdp_config", "deepspeed")


def normalize_and_validate(args) -> None:
    """Everything TrainingArguments.__post_init__ does, in order. Idempotent, so that
    `dataclasses.replace(args, ...)` and `TrainingArguments(**args.to_dict())` give equal objects."""
    if args.output_dir is None:
        args.output_dir = "trainer_output"
    if not isinstance(args.output_dir, (str, os.PathLike)):
        raise TypeError(f"output_dir must be a path (str), got {args.output_dir!r} ({type(args.output_dir).__name__})")
    args.output_dir = os.path.expanduser(args.output_dir)
    check_output_dir(args.output_dir)
    if isinstance(args.torch_empty_cache_steps, float):  # transformers refuses 1.0 here, before any conversion
        raise ValueError(
            f"torch_empty_cache_steps must be a positive integer or None, got {args.torch_empty_cache_steps}"
        )
    coerce_field_types(args)
    if args.push_to_hub:
        raise ValueError("push_to_hub=True is not supported: lathe works offline. Copy output_dir to the Hub yourself.")
    if getattr(args, "sortish_sampler", False):
        warn_from_user_code(
            "sortish_sampler=True has no effect: transformers 5.23 defines it but no sampler reads it, nor does lathe."
        )
    if args.past_index != -1:
        raise ValueError(
            f"past_index={args.past_index}: transformers 5 removed it (it fed a model's memory output, such as "
            "Transformer-XL's mems, back as an input); lathe does not support it. Leave past_index at -1."
        )

    map_deprecated_names(args)
    parse_dict_fields(args)
    check_integration_fields(args)
    resolve_checkpointing_alias(args)
    convert_choice_fields(args)
    fill_dependent_defaults(args)

    check_training_length(args)
    check_step_intervals(args)
    check_best_model(args)
    check_precision(args)
    check_scheduler(args)
    check_dataloader(args)


# --- Conversions ---


def parse_dict_fields(args) -> None:
    """Turn JSON object strings (from the command line) into dicts, with CLI strings made typed."""
    for name in _DICT_FIELDS:
        value = getattr(args, name)
        if not isinstance(value, str):
            continue
        if not value.lstrip().startswith("{"):
            if name in _DICT_OR_PATH_FIELDS:
                continue  # a path to a JSON file, read by the FSDP / DeepSpeed set-up
            raise ValueError(f"{name} must be a dict or a JSON object string, got {value!r}")
        try:
            setattr(args, name, _typed_cli_values(json.loads(value)))
        except json.JSONDecodeError as error:
            raise ValueError(f"{name} is not valid JSON ({error}): {value!r}") from None


def _typed_cli_values(d: dict) -> dict:
    """Shell users quote everything: '{"power": "2"}' means 2. Convert booleans and numbers, recursively."""
    for key, value in d.items():
        if isinstance(value, dict):
            d[key] = _typed_cli_values(value)
        elif isinstance(value, str):
            if value.lower() in ("true", "false"):
                d[key] = value.lower() == "true"
            elif value.isdigit():
                d[key] = int(value)
            elif value.replace(".", "", 1).isdigit():
                d[key] = float(value)
    return d


def resolve_checkpointing_alias(args) -> None:
    """gradient_checkpointing* are transformers 5's deprecated aliases of activation_checkpointing*.

    The old name is used only when the new one is unset; afterwards both hold the same value, so
    code reading either works and a copy that changes the new name is not overridden by the old.
    """
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if getattr(args, new) is None and getattr(args, old) is not None:
            warn_from_user_code(f"`{old}` is deprecated in transformers 5 (removed in 6); use `{new}` instead.")
            setattr(args, new, getattr(args, old))
        setattr(args, old, getattr(args, new))
    if args.activation_checkpointing is None:
        args.activation_checkpointing = args.gradient_checkpointing = False


def convert_choice_fields(args) -> None:
    args.eval_strategy = to_enum(IntervalStrategy, yaml_no(args.eval_strategy), "eval_strategy")
    args.logging_strategy = to_enum(IntervalStrategy, yaml_no(args.logging_strategy), "logging_strategy")
    args.save_strategy = to_enum(SaveStrategy, yaml_no(args.save_strategy), "save_strategy")
    args.lr_scheduler_type = to_enum(SchedulerType, args.lr_scheduler_type, "lr_scheduler_type")
    args.optim = to_enum(OptimizerNames, args.optim, "optim")

    if isinstance(args.include_num_input_tokens_seen, bool):
        args.include_num_input_tokens_seen = "all" if args.include_num_input_tokens_seen else "no"
    _check_choice(args, "include_num_input_tokens_seen", _TOKENS_SEEN_CHOICES)
    if isinstance(args.chunked_cross_entropy, bool):
        args.chunked_cross_entropy = "yes" if args.chunked_cross_entropy else "no"
    _check_choice(args, "chunked_cross_entropy", _metadata_choices(args, "chunked_cross_entropy"))
    if args.chunked_cross_entropy_size is not None and args.chunked_cross_entropy_size < 1:
        raise ValueError(
            f"chunked_cross_entropy_size must be a positive number of tokens, got {args.chunked_cross_entropy_size}"
        )
    _check_choice(args, "log_level", LOG_LEVELS)
    _check_choice(args, "log_level_replica", LOG_LEVELS)
    _check_choice(args, "train_sampling_strategy", _metadata_choices(args, "train_sampling_strategy"))
    _check_choice(args, "ddp_backend", _metadata_choices(args, "ddp_backend"), optional=True)
    _check_choice(
        args,
        "dataloader_multiprocessing_context",
        _metadata_choices(args, "dataloader_multiprocessing_context"),
        optional=True,
    )

    if isinstance(args.include_for_metrics, str):
        args.include_for_metrics = [args.include_for_metrics]
    unknown = [name for name in args.include_for_metrics if name not in _METRIC_INPUTS]
    if unknown:
        raise ValueError(f"include_for_metrics has unknown entries {unknown}; allowed: {list(_METRIC_INPUTS)}")

    from lathe.train.parallel.fsdp import settings_from_args

    settings_from_args(args)  # fsdp / fsdp_config: unknown options, keys and values are errors here, not at train()
    if args.deepspeed is not None:
        from lathe.train.parallel.deepspeed_zero import validate

        validate(args)  # the package, the config's keys, and no contradiction with these arguments


def _check_choice(args, name: str, choices, optional: bool = False) -> None:
    value = getattr(args, name)
    if optional and value is None:
        return
    if not isinstance(value, (str, int, float, bool, type(None))) or value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {list(choices)}")


def _metadata_choices(args, name: str) -> list:
    # The allowed values live once, in the field's metadata, where the argument parser also reads them.
    return next(f.metadata["choices"] for f in fields(args) if f.name == name)


def normalize_report_to(value) -> list[str]:
    """'none'/None -> [], 'all' -> every installed supported reporter, a name -> [name]; names are checked."""
    if value is None or value == "none" or value == ["none"]:
        return with_kubeflow([])
    if value == "all" or value == ["all"]:
        return available_reporters()  # the installed integrations, as transformers resolves "all"
    names = [value] if isinstance(value, str) else list(value)
    unknown = [name for name in names if name not in SUPPORTED_REPORTERS]
    if unknown:
        raise ValueError(
            f"report_to has unsupported entries {unknown}; choose from {list(SUPPORTED_REPORTERS)}, 'all' or 'none'"
        )
    return with_kubeflow(names)


def fill_dependent_defaults(args) -> None:
    """Defaults that depend on other fields, as transformers fills them."""
    if args.eval_strategy != IntervalStrategy.NO:
        args.do_eval = True

    # An unset (or 0) eval_steps follows logging_steps.
    if args.eval_strategy == IntervalStrategy.STEPS and not args.eval_steps:
        if not args.logging_steps or args.logging_steps <= 0:
            raise ValueError("eval_strategy='steps' needs a positive eval_steps (or logging_steps to default from).")
        logging.getLogger("lathe.train.args.training_args").info(
            "eval_steps is unset: using logging_steps=%s.", args.logging_steps
        )
        args.eval_steps = args.logging_steps

    needs_metric = args.load_best_model_at_end or args.lr_scheduler_type in (
        SchedulerType.REDUCE_ON_PLATEAU,
        SchedulerType.GREEDY,
    )
    if needs_metric and args.metric_for_best_model is None:
        args.metric_for_best_model = "loss"
    if args.save_strategy == SaveStrategy.BEST and args.metric_for_best_model is None:
        raise ValueError(  # transformers' sentence first: code written for it matches on it
            "`args.metric_for_best_model` must be provided when using 'best' save_strategy: save_strategy='best' "
            "needs metric_for_best_model (e.g. 'loss' or 'eval_accuracy')."
        )
    # "loss" and "eval_loss" both end in "loss": lower is better for losses, higher for anything else.
    if args.greater_is_better is None and args.metric_for_best_model is not None:
        args.greater_is_better = not args.metric_for_best_model.endswith("loss")

    args.report_to = normalize_report_to(args.report_to)

    if args.disable_tqdm is None:
        args.disable_tqdm = logging.getLogger("lathe").getEffectiveLevel() > logging.WARNING

    if (args.torch_compile_backend or args.torch_compile_mode) and not args.torch_compile:
        args.torch_compile = True
    if args.torch_compile and args.torch_compile_backend is None:
        args.torch_compile_backend = "inductor"

    # Pinned memory only speeds up host-to-accelerator copies; on the CPU it just costs memory.
    if args.use_cpu:
        args.dataloader_pin_memory = False


# --- Checks ---


def check_training_length(args) -> None:
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(args, name)}")
    if args.learning_rate < 0:
        raise ValueError(f"learning_rate must be >= 0, got {args.learning_rate}")
    if args.num_train_epochs < 0:
        raise ValueError(f"num_train_epochs must be >= 0, got {args.num_train_epochs}")
    if args.max_steps != -1 and args.max_steps <= 0:
        raise ValueError(
            f"max_steps must be a positive number of steps, or -1 to use num_train_epochs; got {args.max_steps}"
        )
    if args.warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0 (a step count, or a fraction in [0, 1)); got {args.warmup_steps}")
    if args.warmup_steps >= 1:
        args.warmup_steps = _whole_steps("warmup_steps", args.warmup_steps)
    if args.eval_accumulation_steps is not None and args.eval_accumulation_steps < 1:
        raise ValueError(f"eval_accumulation_steps must be at least 1 or None, got {args.eval_accumulation_steps}")
    if args.torch_empty_cache_steps is not None and not (
        isinstance(args.torch_empty_cache_steps, int) and args.torch_empty_cache_steps > 0
    ):
        raise ValueError(
            f"torch_empty_cache_steps must be a positive integer or None, got {args.torch_empty_cache_steps}"
        )


def check_output_dir(output_dir: str) -> None:
    """Also called when training starts: the file may appear after the arguments were made."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(
            f"output_dir={output_dir!r} is an existing file, not a folder: checkpoints and results "
            "go into a folder there. Choose another output_dir, or move the file away."
        )


def make_output_dir(output_dir: str) -> None:
    """The Trainer makes output_dir when it is built, as transformers does; an error says which folder."""
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as error:  # the errno is kept (OSError(errno, ...) picks the subclass)
        message = f"Cannot create output_dir {output_dir!r}: {error}. Check that output_dir is writable."
        raise (OSError(error.errno, message) if error.errno is not None else OSError(message)) from error


def check_step_intervals(args) -> None:
    """logging/eval/save steps: a whole number of steps (10.0 becomes 10), or a fraction in (0, 1)."""
    if args.logging_strategy == IntervalStrategy.STEPS and args.logging_steps == 0:
        raise ValueError("logging_strategy='steps' needs a non-zero logging_steps.")
    # transformers accepts save_steps=0 and then never saves; a save strategy that saves nothing is an error here.
    if args.save_strategy == SaveStrategy.STEPS and args.save_steps == 0:
        raise ValueError(
            "save_strategy='steps' needs a positive save_steps (0 would never save); "
            "set save_strategy='no' to save no checkpoints."
        )
    for strategy, name in (
        (args.logging_strategy, "logging_steps"),
        (args.eval_strategy, "eval_steps"),
        (args.save_strategy, "save_steps"),
    ):
        if strategy != IntervalStrategy.STEPS:
            continue
        value = getattr(args, name)
        if value < 0:
            raise ValueError(f"{name} must be positive, got {value}")
        if value >= 1:
            setattr(args, name, _whole_steps(name, value))


def _whole_steps(name: str, value) -> int:
    if not math.isfinite(value) or value != int(value):
        raise ValueError(
            f"{name} must be a whole number when >= 1 (below 1 it is a fraction of all steps), got {value}"
        )
    return int(value)


def check_best_model(args) -> None:
    if not args.load_best_model_at_end or args.save_strategy == SaveStrategy.BEST:
        return
    if args.eval_strategy != args.save_strategy:
        raise ValueError(
            "load_best_model_at_end needs save_strategy to match eval_strategy (or save_strategy='best'), "
            f"but eval_strategy={args.eval_strategy.value!r} and save_strategy={args.save_strategy.value!r}."
        )
    if args.eval_strategy == IntervalStrategy.STEPS and not _is_multiple(args.save_steps, args.eval_steps):
        raise ValueError(
            "load_best_model_at_end needs save_steps to be a multiple of eval_steps (both step counts or both "
            f"fractions), but save_steps={args.save_steps} and eval_steps={args.eval_steps}."
        )


def _is_multiple(save_steps, eval_steps) -> bool:
    if save_steps >= 1 and eval_steps >= 1:
        return save_steps % eval_steps == 0
    if save_steps >= 1 or eval_steps >= 1:
        return False  # a count and a fraction: which steps coincide depends on the run length
    # Both fractions: compare in millionths, since 0.3 % 0.1 is not 0 in floating point.
    return round(save_steps * 1_000_000) % round(eval_steps * 1_000_000) == 0


def check_precision(args) -> None:
    if args.fp16 and args.bf16:
        raise ValueError("fp16 and bf16 cannot both be True; pick one.")
    if args.fp16_full_eval and args.bf16_full_eval:
        raise ValueError("fp16_full_eval and bf16_full_eval cannot both be True; pick one.")
    if (args.bf16 or args.bf16_full_eval) and not args.use_cpu:
        # Only worth importing torch when bf16 was asked for: a CUDA GPU older than Ampere cannot do it.
        import torch

        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            raise ValueError("bf16 needs an Ampere or newer GPU; set fp16=True instead, or use_cpu=True.")
    if args.tf32:
        from lathe.train.runtime import tf32_available

        if not tf32_available():
            raise ValueError(
                "tf32=True needs an Ampere or newer NVIDIA GPU with CUDA (TF32 matmuls), and none is available "
                "here; leave tf32 unset (None) or False."
            )


def check_scheduler(args) -> None:
    if args.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY) and (
        args.eval_strategy == IntervalStrategy.NO
    ):
        raise ValueError(
            f"lr_scheduler_type={args.lr_scheduler_type.value!r} reacts to evaluation results, so eval_strategy "
            "must be 'steps' or 'epoch'."
        )


def check_dataloader(args) -> None:
    if args.dataloader_num_workers < 0:
        raise ValueError(f"dataloader_num_workers must be >= 0, got {args.dataloader_num_workers}")
    if args.dataloader_prefetch_factor is not None and args.dataloader_num_workers == 0:
        raise ValueError("dataloader_prefetch_factor needs dataloader_num_workers > 0 (workers do the prefetching).")
