"""What TrainingArguments derives from its fields: batch sizes, the device, process ranks, warmup steps,
the log level, and its dict / JSON forms. Mixed into TrainingArguments (training_args.py)."""

import contextlib
import json
import logging
import math
import os
import sys
from dataclasses import fields
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any

from lathe.train.args.validation import LOG_LEVELS

logger = logging.getLogger("lathe.train.args.training_args")


class DerivedValues:
    """Properties and methods of TrainingArguments that read its fields and never change them."""

    @property
    def train_batch_size(self) -> int:
        """Samples per device per micro-batch. lathe never uses DataParallel, so this is the per-device size."""
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        """Samples per device per evaluation batch."""
        return self.per_device_eval_batch_size

    @property
    def ddp_timeout_delta(self) -> timedelta:
        return timedelta(seconds=self.ddp_timeout)

    @property
    def device(self) -> "torch.device":  # noqa: F821 (torch is imported lazily)
        """cuda:<local rank> when CUDA is usable, else mps, else cpu; use_cpu forces cpu.
        Computed once (the loop reads it on every step), like transformers' cached device."""
        cached = self.__dict__.get("_cached_device")
        # What the device depends on, cheap to ask on every step: the local rank only changes when
        # local_rank is set or a process group comes up (then LOCAL_RANK or the rank decide it).
        if cached is None or cached[0] != (self.use_cpu, self.local_rank, _initialized_process_group() is not None):
            self._process_group()  # under a launcher, resolving the device joins the process group (transformers too)
            device = self._find_device()
            key = (self.use_cpu, self.local_rank, _initialized_process_group() is not None)
            self.__dict__["_cached_device"] = cached = (key, device)
        return cached[1]

    def _find_device(self) -> "torch.device":  # noqa: F821
        import torch

        if not self.use_cpu:
            if torch.cuda.is_available():
                return torch.device("cuda", self.local_process_index)
            mps = getattr(torch.backends, "mps", None)
            if mps is not None and mps.is_available():
                return torch.device("mps")
        return torch.device("cpu")

    @property
    def n_gpu(self) -> int:
        """Accelerators this process drives: 1 on cuda or mps, 0 on cpu (never more: no DataParallel)."""
        return 0 if self.device.type == "cpu" else 1

    @property
    def world_size(self) -> int:
        group = self._process_group()
        return group.get_world_size() if group else 1

    @property
    def process_index(self) -> int:
        group = self._process_group()
        return group.get_rank() if group else 0

    @property
    def local_process_index(self) -> int:
        """Rank within this node: `local_rank` when given, else torchrun's LOCAL_RANK, else the global rank."""
        if self.local_rank >= 0:
            return self.local_rank
        if self._process_group() is not None and os.environ.get("LOCAL_RANK", "").isdigit():
            return int(os.environ["LOCAL_RANK"])
        return self.process_index

    def _process_group(self):
        """torch.distributed once the process group is up. Under a launcher (WORLD_SIZE > 1) the first
        question joins the group, with ddp_backend and ddp_timeout, as transformers does when its
        arguments first resolve the device; otherwise torch is not even imported."""
        group = _initialized_process_group()
        if group is None and os.environ.get("WORLD_SIZE", "1") not in ("", "0", "1"):
            from lathe.train.parallel.distributed import init_process_group

            init_process_group(self)
            group = _initialized_process_group()
        return group

    @property
    def should_log(self) -> bool:
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        return (self.local_process_index if self.save_on_each_node else self.process_index) == 0

    def get_process_log_level(self) -> int:
        """The `logging` level for this process: log_level on the logging process, log_level_replica elsewhere;
        'passive' keeps the current level of the 'lathe' logger."""
        name = self.log_level if self.should_log else self.log_level_replica
        level = LOG_LEVELS[name]
        return logging.getLogger("lathe").getEffectiveLevel() if level < 0 else level

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work"):
        """Run the body on the main process (of the node when `local`) before the others.

        Used around dataset preprocessing: the main process fills the cache, the replicas then read it.
        Without a process group this is a no-op.
        """
        if self.world_size <= 1:
            yield
            return
        import torch.distributed as dist

        is_main = (self.local_process_index if local else self.process_index) == 0
        if not is_main:
            logger.debug("rank %d waits for the main process to finish %s", self.process_index, desc)
            dist.barrier()  # replicas wait here until the main process reaches its barrier below
        try:
            yield
        finally:
            if is_main:
                dist.barrier()  # releases the replicas waiting above

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup length in steps: warmup_steps itself when >= 1, else that fraction of all steps, rounded up."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil(num_training_steps * self.warmup_steps)

    # --- Serialisation ---

    def to_dict(self) -> dict[str, Any]:
        """All fields as JSON-safe values, in transformers' order (libraries list them as they come: a
        sentence-transformers model card): enums become their strings, config objects their dicts; secrets
        (fields ending in `_token`) are masked as transformers masks them ("<HUB_TOKEN>"). lathe's own fields
        (LATHE_ONLY_FIELDS) are listed only when set, so a run that does not use them saves what transformers does."""
        values = {name: _json_safe(getattr(self, name)) for name in _listed_fields(self)}
        return {key: f"<{key.upper()}>" if key.endswith("_token") else value for key, value in values.items()}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """Flat scalars only (anything else as its str), for TensorBoard's hparams."""
        d = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in d.items()}

    def __str__(self) -> str:
        lines = "".join(f"{k}={v},\n" for k, v in sorted(self.to_dict().items()))
        return f"{type(self).__name__}(\n{lines})"

    __repr__ = __str__


# Fields transformers 5.23's TrainingArguments does not have: lathe's options and the old names it still reads.
LATHE_ONLY_FIELDS = frozenset(
    (
        "chunked_cross_entropy",
        "chunked_cross_entropy_size",
        "past_index",
        "warmup_ratio",
        "evaluation_strategy",
        "group_by_length",
        "logging_dir",
        "overwrite_output_dir",
        "save_safetensors",
        "no_cuda",
    )
)


# transformers 5.23's TrainingArguments fields in its declaration order (what its to_dict lists).
TRANSFORMERS_FIELD_ORDER = (
    "output_dir",
    "per_device_train_batch_size",
    "num_train_epochs",
    "max_steps",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "optim",
    "optim_args",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "optim_target_modules",
    "gradient_accumulation_steps",
    "average_tokens_across_devices",
    "max_grad_norm",
    "label_smoothing_factor",
    "bf16",
    "fp16",
    "bf16_full_eval",
    "fp16_full_eval",
    "tf32",
    "activation_checkpointing",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
    "torch_compile",
    "torch_compile_backend",
    "torch_compile_mode",
    "use_liger_kernel",
    "liger_kernel_config",
    "use_cache",
    "neftune_noise_alpha",
    "torch_empty_cache_steps",
    "auto_find_batch_size",
    "logging_strategy",
    "logging_steps",
    "logging_first_step",
    "log_on_each_node",
    "logging_nan_inf_filter",
    "include_num_input_tokens_seen",
    "log_level",
    "log_level_replica",
    "disable_tqdm",
    "report_to",
    "run_name",
    "project",
    "trackio_space_id",
    "trackio_bucket_id",
    "trackio_static_space_id",
    "eval_strategy",
    "eval_steps",
    "eval_delay",
    "per_device_eval_batch_size",
    "prediction_loss_only",
    "eval_on_start",
    "eval_do_concat_batches",
    "eval_use_gather_object",
    "eval_accumulation_steps",
    "include_for_metrics",
    "batch_eval_metrics",
    "save_only_model",
    "save_strategy",
    "save_steps",
    "save_on_each_node",
    "save_total_limit",
    "enable_jit_checkpoint",
    "push_to_hub",
    "hub_token",
    "hub_private_repo",
    "hub_model_id",
    "hub_strategy",
    "hub_always_push",
    "hub_revision",
    "load_best_model_at_end",
    "metric_for_best_model",
    "greater_is_better",
    "ignore_data_skip",
    "restore_callback_states_from_checkpoint",
    "full_determinism",
    "seed",
    "data_seed",
    "use_cpu",
    "accelerator_config",
    "parallelism_config",
    "dataloader_drop_last",
    "dataloader_num_workers",
    "dataloader_pin_memory",
    "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context",
    "dataloader_in_order",
    "remove_unused_columns",
    "label_names",
    "train_sampling_strategy",
    "length_column_name",
    "ddp_find_unused_parameters",
    "ddp_bucket_cap_mb",
    "ddp_broadcast_buffers",
    "ddp_static_graph",
    "ddp_backend",
    "ddp_timeout",
    "fsdp",
    "fsdp_config",
    "deepspeed",
    "debug",
    "skip_memory_metrics",
    "do_train",
    "do_eval",
    "do_predict",
    "resume_from_checkpoint",
    "local_rank",
)
_POSITION = {name: index for index, name in enumerate(TRANSFORMERS_FIELD_ORDER)}


def _listed_fields(args) -> list[str]:
    """The order of transformers' dataclass: its own fields, then each subclass's new ones in declaration order
    (a subclass redeclaring one of LATHE_ONLY_FIELDS declares a new field on transformers); then lathe's own
    fields that differ from their defaults."""
    TrainingArguments = next(  # lathe's base class (training_args.py mixes this module in: no import back)
        klass
        for klass in type(args).__mro__
        if klass.__name__ == "TrainingArguments" and klass.__module__ == "lathe.train.args.training_args"
    )
    base = TrainingArguments.__dataclass_fields__
    own = {f.name: f for f in fields(args) if f.init}
    redeclared = {name for name in LATHE_ONLY_FIELDS if name in own and own[name] is not base.get(name)}
    order = sorted((name for name in own if name in _POSITION), key=_POSITION.__getitem__)
    for klass in reversed(type(args).__mro__):
        if klass is TrainingArguments or not issubclass(klass, TrainingArguments):
            continue
        for name in klass.__dict__.get("__annotations__", {}):
            if name in own and name not in order and (name not in base or name in redeclared):
                order.append(name)
    for name in own:
        if name not in order and getattr(args, name) != own[name].default:
            order.append(name)
    return order


def _initialized_process_group():
    """torch.distributed when a process group is up, else None.

    A process group cannot exist unless torch.distributed was imported, so looking in sys.modules
    first keeps rank queries (should_log, should_save) from importing torch.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _json_safe(value):
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value).removeprefix("torch.")  # torch.bfloat16 -> "bfloat16", as transformers writes dtypes
    if hasattr(value, "to_dict"):  # e.g. a GenerationConfig in Seq2SeqTrainingArguments
        return _json_safe(value.to_dict())
    return value
