"""DeepSpeed ZeRO, an optional engine for lathe's training loop (`TrainingArguments(deepspeed=...)`).

The loop stays lathe's; what DeepSpeed's engine takes over is the part ZeRO changes: the backward
pass (gradients reduced into each rank's partition), the optimizer step over the partitioned fp32
master weights (with clipping from `gradient_clipping` and, for fp16, loss scaling), the scheduler
step and zeroing, and the checkpoint files of the optimizer state. The optimizer and scheduler are
still lathe's (TrainingArguments optim, learning_rate, lr_scheduler_type, ...): DeepSpeed wraps them.

The config is the file transformers and LLaMA-Factory users already have: "auto" values are filled
from TrainingArguments as transformers fills them, and an explicit value that contradicts the
arguments is an error naming both, since one of the two would otherwise be silently ignored.

Why N ZeRO ranks train what one process does: ZeRO averages the ranks' gradients as DDP does, so
the Trainer's step maths (lathe.train.parallel.distributed) applies unchanged; lathe normalises the loss
itself (`scale_wrt_gas=False`) and tells the engine where each accumulation window ends.

Checkpoints keep transformers' layout: checkpoint-N/ holds model.safetensors (full weights) beside
DeepSpeed's own files, read safely (lathe.train.parallel.deepspeed_checkpoint).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os

from lathe.train.parallel.deepspeed_checkpoint import (  # noqa: F401 (the engine's checkpoint API, here too)
    full_state_dict,
    has_checkpoint,
    load,
    safe_checkpoint_engine,
    save,
    tag,
)
from lathe.train.parallel.deepspeed_ops import announce_compiles
from lathe.train.parallel.quiet_collectives import quiet_collectives

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'lathe[deepspeed]'  (or: pip install deepspeed)"

# Every top-level key DeepSpeed 0.19's config parser reads (DeepSpeedConfig._initialize_params and the
# section parsers it calls); the sections' own keys DeepSpeed validates itself. A key outside this list
# DeepSpeed would ignore without a word, so a misspelt one is an error here.
_KNOWN_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_optimization",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "fp16",
    "bf16",
    "steps_per_print",
    "wall_clock_breakdown",
    "memory_breakdown",
    "dump_state",
    "prescale_gradients",
    "gradient_predivide_factor",
    "gradient_allreduce_op",
    "communication_data_type",
    "seq_parallel_communication_data_type",
    "activation_checkpointing",
    "flops_profiler",
    "comms_logger",
    "checkpoint",
    "data_types",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "aio",
    "torch_autocast",
    "compile",
    "autotuning",
    "data_efficiency",
    "datastates_ckpt",
    "dataloader_drop_last",
    "disable_allgather",
    "disable_python_gc",
    "expert_parallel",
    "hybrid_engine",
    "log_level",
    "managed_gradient_accumulation",
    "pipeline",
    "tensor_parallel",
    "timers",
    "use_data_before_expert_parallelism",
    "weight_quantization",
)
# Keys LLaMA-Factory's example configs carry that DeepSpeed 0.19 never reads (its communication logger
# and monitors are configured by comms_logger, tensorboard, wandb, csv_monitor, comet): accepted, with a
# warning that they do nothing, as DeepSpeed would silently do nothing with them.
_NOT_READ_BY_DEEPSPEED = ("comms_config", "monitor_config")
# Sections where DeepSpeed would build its own optimizer / scheduler instead of lathe's.
_OWN_OPTIMIZER_SECTIONS = ("optimizer", "scheduler")


def import_deepspeed():
    """The deepspeed package, or an ImportError that says how to install it."""
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            # Say it rather than let DeepSpeed probe for GPUs and warn that it fell back to the CPU.
            os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        import deepspeed
    except ImportError as error:
        raise ImportError(
            f"TrainingArguments.deepspeed is set, but the deepspeed package is not installed: {INSTALL_HINT}."
        ) from error
    return deepspeed


def read_config(value) -> dict:
    """The DeepSpeed config from a dict or the path of a JSON file; errors name the file."""
    if isinstance(value, dict):
        return json.loads(json.dumps(value))  # a copy the filling below may change
    path = os.path.expanduser(str(value))
    if not os.path.isfile(path):
        raise ValueError(f"deepspeed={value!r}: no such file; pass the path of a DeepSpeed JSON config or a dict.")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as error:
        raise ValueError(f"deepspeed config {path!r} is not valid JSON: {error}") from error
    if not isinstance(config, dict):
        raise ValueError(f"deepspeed config {path!r} must hold a JSON object, got {type(config).__name__}.")
    return config


def validate(args) -> dict:
    """Check TrainingArguments.deepspeed once, when the arguments are made: the package is there, the
    config's keys are known, and nothing contradicts the other arguments. Returns the config."""
    config = read_config(args.deepspeed)
    where = f"deepspeed config {args.deepspeed!r}" if not isinstance(args.deepspeed, dict) else "deepspeed config"
    for key in config:
        if key.startswith("_"):
            continue  # a JSON comment ("_comment"), by the usual convention; DeepSpeed skips it too
        if key in _NOT_READ_BY_DEEPSPEED:
            logger.warning(
                "%s: DeepSpeed does not read %r, so it has no effect (its settings belong in %s).",
                where,
                key,
                "comms_logger" if key == "comms_config" else "tensorboard / wandb / csv_monitor / comet",
            )
            continue
        if key in _OWN_OPTIMIZER_SECTIONS:
            raise ValueError(
                f"{where}: the {key!r} section is not supported. lathe builds the optimizer and scheduler from TrainingArguments "
                "(optim, learning_rate, weight_decay, adam_beta1/2, adam_epsilon, lr_scheduler_type, warmup_steps) and DeepSpeed "
                f"wraps them: remove {key!r} from the config and set those arguments instead."
            )
        if key not in _KNOWN_KEYS:
            removed = _removed_by_deepspeed().get(key)
            if removed:
                raise ValueError(f"{where}: {key!r}: {removed}")
            close = difflib.get_close_matches(key, _KNOWN_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{where} has an unknown key {key!r}{hint}")
    if int((config.get("tensor_parallel") or {}).get("autotp_size") or 0) > 1:
        raise ValueError(
            f"{where}: tensor_parallel.autotp_size > 1 (DeepSpeed AutoTP) is not supported: lathe gives every process its "
            "own share of the data, while tensor-parallel ranks must see the same batch. Shard with ZeRO-3 or FSDP2 instead."
        )
    stage = zero_stage(config)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}.")
    if args.fsdp:
        raise ValueError(
            "deepspeed and fsdp are both set: choose one way to shard the model (FSDP2 via fsdp, or DeepSpeed ZeRO)."
        )
    if args.auto_find_batch_size:
        raise ValueError(
            "auto_find_batch_size cannot be used with deepspeed: the micro-batch size is fixed in DeepSpeed's "
            "engine. Set per_device_train_batch_size instead."
        )
    if stage == 3 and args.load_best_model_at_end:
        raise ValueError(
            "load_best_model_at_end with ZeRO stage 3 is not supported: the partitioned weights cannot take a "
            "checkpoint's full tensors in place. Use stage 2, or load the best checkpoint after training."
        )
    _fill(config, args, world_size=None, hidden_size=None, where=where)  # mismatches are errors now, not at train()
    import_deepspeed()
    return config


def _removed_by_deepspeed() -> dict:
    """DeepSpeed's own explanations for the keys of features it removed (amp, elasticity, ...)."""
    try:
        import_deepspeed()
        from deepspeed.runtime.config import _REMOVED_TOP_LEVEL_CONFIG_KEYS
    except ImportError:
        return {}
    return dict(_REMOVED_TOP_LEVEL_CONFIG_KEYS)


def zero_stage(config: dict):
    return (config.get("zero_optimization") or {}).get("stage", 0)


def engine_config(args, world_size: int, model) -> dict:
    """The config handed to deepspeed.initialize, with every "auto" resolved."""
    config = read_config(args.deepspeed)
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    _fill(config, args, world_size=world_size, hidden_size=hidden, where="deepspeed config")
    config.setdefault(
        "zero_allow_untested_optimizer", True
    )  # the optimizer is lathe's, chosen by TrainingArguments.optim
    config.setdefault(
        "steps_per_print", 2**31 - 1
    )  # lathe logs the loss; DeepSpeed's own progress lines would repeat it
    return config


def _fill(config: dict, args, world_size: int | None, hidden_size: int | None, where: str) -> None:
    """Replace "auto" with the TrainingArguments value; an explicit value that differs is an error.
    world_size / hidden_size None: not known yet (checked again when training starts)."""
    _fill_batch_and_clipping(config, args, world_size, where)
    _fill_precision(config, args, where)
    zero = config.get("zero_optimization")
    if isinstance(zero, dict) and world_size is not None:
        sizes = {
            "reduce_bucket_size": lambda h: h * h,
            "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
            "stage3_param_persistence_threshold": lambda h: 10 * h,
        }
        for key, size in sizes.items():
            if zero.get(key) == "auto":
                if hidden_size is None:
                    del zero[key]  # DeepSpeed's default: the model has no hidden_size to size it by
                else:
                    zero[key] = size(hidden_size)
    leftover = [key for key, value in _walk(config) if value == "auto"]
    if leftover and world_size is not None:
        raise ValueError(f'{where}: lathe cannot fill "auto" for {", ".join(leftover)}; give a value.')


def _fill_batch_and_clipping(config: dict, args, world_size: int | None, where: str) -> None:
    micro = args.per_device_train_batch_size
    accumulation = args.gradient_accumulation_steps
    pairs = [
        ("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size"),
        ("gradient_accumulation_steps", accumulation, "gradient_accumulation_steps"),
        ("gradient_clipping", args.max_grad_norm or 0.0, "max_grad_norm"),
    ]
    if world_size is not None:
        pairs.append(
            (
                "train_batch_size",
                micro * accumulation * world_size,
                "per_device_train_batch_size x gradient_accumulation_steps x processes",
            )
        )
    for key, value, source in pairs:
        current = config.get(key, "auto")
        if current == "auto":
            if world_size is not None or key != "train_batch_size":
                config[key] = value
        elif _differs(current, value):
            raise ValueError(
                f'{where}: {key}={current!r} but TrainingArguments {source} = {value!r}. Set {key} to "auto" '
                "(or to the same value) so that both agree."
            )


def _fill_precision(config: dict, args, where: str) -> None:
    for name, enabled in (("fp16", args.fp16), ("bf16", args.bf16)):
        section = config.get(name)
        if section is None and enabled:
            section = config[name] = {"enabled": True}  # asked for in TrainingArguments: the engine must know
        if not isinstance(section, dict):
            continue
        current = section.get("enabled", "auto")
        if current == "auto":
            section["enabled"] = bool(enabled)
        elif bool(current) != bool(enabled):
            raise ValueError(
                f'{where}: {name}.enabled={current!r} but TrainingArguments {name}={enabled!r}; set it to "auto".'
            )


def _differs(current, value) -> bool:
    try:
        return abs(float(current) - float(value)) > 1e-12 * max(1.0, abs(float(value)))
    except (TypeError, ValueError):
        return True


def _walk(config: dict, prefix: str = ""):
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _walk(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


# ----- the engine in the training loop -----


def ensure_process_group(args) -> None:
    """DeepSpeed needs a process group even for one process; torchrun's, or a private one-process group."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    args.world_size  # under torchrun, joins the launcher's group  # noqa: B018
    if dist.is_initialized():
        return
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # What a launcher would have set: DeepSpeed's engine reads LOCAL_RANK from the environment.
    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(port)),
    ):
        os.environ.setdefault(name, value)
    dist.init_process_group("gloo", rank=0, world_size=1)
    from lathe.train.parallel.distributed import leave_process_group_at_exit

    leave_process_group_at_exit()


def initialize(model, optimizer, lr_scheduler, args):
    """deepspeed.initialize around lathe's model, optimizer and scheduler; returns the engine."""
    deepspeed = import_deepspeed()
    ensure_process_group(args)
    import torch.distributed as dist

    config = engine_config(args, dist.get_world_size(), model)
    announce_compiles(config, args)  # a first run compiles C++ ops in deepspeed.initialize, without a word
    optimizer = _offloaded(optimizer, config)
    with quiet_collectives():
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, config=config
        )
    engine.checkpoint_engine = safe_checkpoint_engine(engine.checkpoint_engine)
    return engine


def _offloaded(optimizer, config: dict):
    """With the optimizer offloaded to the CPU (zero_optimization.offload_optimizer), DeepSpeed insists on its
    own CPU kernels unless zero_force_ds_cpu_optimizer is false: the optimizer becomes DeepSpeed's CPU Adam
    (AdamW mode for AdamW) or CPU Adagrad over the same parameter groups, as accelerate does for transformers."""
    device = ((config.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device", "none")
    if device in (None, "none") or not config.get("zero_force_ds_cpu_optimizer", True):
        return optimizer
    import torch

    defaults = {key: value for key, value in optimizer.defaults.items() if key in ("lr", "weight_decay")}
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW), **defaults)
    if isinstance(optimizer, torch.optim.Adagrad):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    raise ValueError(
        f"ZeRO-Offload (zero_optimization.offload_optimizer) runs DeepSpeed's CPU Adam or Adagrad, not "
        f"{type(optimizer).__name__}: use optim adamw_torch / adagrad, or set zero_force_ds_cpu_optimizer: false."
    )


def backward(engine, loss) -> None:
    """The loss is normalised by lathe already (per accumulation window and token count)."""
    with quiet_collectives():
        engine.backward(loss, scale_wrt_gas=False)


def step(engine):
    """Optimizer step (clip, step, scheduler, zero) at the end of a window; returns the pre-clip grad norm."""
    with quiet_collectives():
        engine.step()
    norm = engine.get_global_grad_norm()
    return None if norm is None else float(norm)


def partitions_weights(engine) -> bool:
    """Whether `engine` (None: no DeepSpeed) keeps each weight in pieces across ranks (ZeRO-3)."""
    return engine is not None and engine.zero_optimization_stage() == 3


@contextlib.contextmanager
def gathered_parameters(model):
    """A context in which every ZeRO-3 partitioned weight of `model` is whole on every rank (read only)."""
    deepspeed = import_deepspeed()
    with quiet_collectives(), deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        yield
