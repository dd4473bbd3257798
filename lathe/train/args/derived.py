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
        """All fields as JSON-safe values: enums become their strings, config objects their dicts; secrets
        (fields ending in `_token`) are masked as transformers masks them ("<HUB_TOKEN>")."""
        values = {f.name: _json_safe(getattr(self, f.name)) for f in fields(self) if f.init}
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
