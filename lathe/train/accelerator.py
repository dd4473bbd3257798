"""`Trainer.accelerator`: the part of accelerate's `Accelerator` that libraries built on transformers' Trainer
call (sentence-transformers, TRL, setfit), answered from lathe's own process group and loop, not from
accelerate. Each method gives what accelerate gives in that call (tests/train/test_accelerator.py compares
them); what lathe cannot honour (its own DeepSpeed / FSDP engines' plugins, dataloaders to shard across
processes) raises an error naming the call.

One process: gather / reduce / pad are the identity (reduce returns a copy), as in accelerate. Several
processes (torchrun): torch.distributed collectives on lathe's group, concatenated in rank order.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import os

import torch

from lathe.train.parallel import collectives, distributed


class DistributedType(str, enum.Enum):
    """accelerate's names (a str enum, so it compares equal to accelerate's DistributedType members)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"


class Unsupported(NotImplementedError, AttributeError):
    """A call on Trainer.accelerator that lathe's runtime cannot honour. Also an AttributeError, so that
    `hasattr(trainer.accelerator, name)` / `getattr(..., default)` answer "absent", as for a missing attribute."""


def _refuse(what: str, why: str):
    raise Unsupported(f"Trainer.accelerator.{what}: {why} (lathe runs its own loop, without accelerate).")


class ProcessState:
    """accelerate's `PartialState` / `Accelerator.state` (and TrainingArguments.distributed_state): where this
    process stands, read from lathe's process group and the arguments."""

    def __init__(self, args):
        self._args = args

    @property
    def device(self) -> torch.device:
        return self._args.device

    @property
    def num_processes(self) -> int:
        return distributed.world_size()

    @property
    def process_index(self) -> int:
        import torch.distributed as dist

        return dist.get_rank() if distributed.is_distributed() else 0

    @property
    def local_process_index(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0")) if distributed.is_distributed() else 0

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def backend(self):
        import torch.distributed as dist

        return dist.get_backend() if distributed.is_distributed() else None

    @property
    def distributed_type(self) -> DistributedType:
        if self._args.deepspeed:
            return DistributedType.DEEPSPEED
        if self._args.fsdp:
            return DistributedType.FSDP
        if not distributed.is_distributed():
            return DistributedType.NO
        return DistributedType.MULTI_GPU if self.device.type == "cuda" else DistributedType.MULTI_CPU

    @property
    def mixed_precision(self) -> str:
        return "bf16" if self._args.bf16 else "fp16" if self._args.fp16 else "no"

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in ("deepspeed_plugin", "fsdp_plugin", "torch_tp_plugin", "megatron_lm_plugin", "parallelism_config"):
            plugin_of = {"deepspeed_plugin": "deepspeed", "fsdp_plugin": "fsdp"}.get(name)
            if plugin_of and getattr(self._args, plugin_of, None):
                _refuse(f"state.{name}", f"lathe runs {plugin_of} itself, without accelerate's plugin object")
            return None
        raise AttributeError(f"Trainer.accelerator.state has no {name!r} on lathe")


class GradientState:
    """accelerate's `GradientState` as transformers' loop drives it: gradients sync on the last micro-batch."""

    def __init__(self):
        self.sync_gradients = True
        self.end_of_dataloader = False
        self.remainder = -1
        self.plugin_kwargs = {"sync_with_dataloader": False}

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients


class LatheAccelerator:
    """What `trainer.accelerator` answers on lathe (see the module docstring)."""

    def __init__(self, trainer):
        self._trainer = trainer
        self.gradient_state = GradientState()
        self.state = ProcessState(trainer.args)
        self.step = 0
        # transformers builds its Accelerator without a GradientAccumulationPlugin: the Trainer divides the loss
        # itself, and accelerate's backward divides by 1.
        self.gradient_accumulation_steps = 1

    @property
    def _args(self):
        return self._trainer.args

    # ----- where this process stands (ProcessState) -----

    device = property(lambda self: self.state.device)
    num_processes = property(lambda self: self.state.num_processes)
    process_index = property(lambda self: self.state.process_index)
    local_process_index = property(lambda self: self.state.local_process_index)
    is_main_process = property(lambda self: self.state.is_main_process)
    is_local_main_process = property(lambda self: self.state.is_local_main_process)
    is_last_process = property(lambda self: self.state.is_last_process)
    use_distributed = property(lambda self: self.state.use_distributed)
    backend = property(lambda self: self.state.backend)
    distributed_type = property(lambda self: self.state.distributed_type)
    mixed_precision = property(lambda self: self.state.mixed_precision)

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @property
    def is_fsdp2(self) -> bool:
        return bool(self._args.fsdp)

    @property
    def parallelism_config(self):
        """None: lathe has no tensor / context / sequence parallelism (TrainingArguments refuses parallelism_config)."""
        return None

    @property
    def dataloader_config(self):
        """accelerate's DataLoaderConfiguration: TrainingArguments.accelerator_config holds the same fields."""
        return self._args.accelerator_config

    @property
    def even_batches(self) -> bool:
        return self.__dict__.get("_even_batches", self._args.accelerator_config.even_batches)

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        """As accelerate: a setting of the dataloaders prepared after it (the arguments keep theirs). lathe's
        evaluation never pads with repeated samples (it cuts by the dataset's size); one process pads nothing."""
        self.__dict__["_even_batches"] = bool(value)

    deepspeed_plugin = property(lambda self: self.state.deepspeed_plugin)
    fsdp_plugin = property(lambda self: self.state.fsdp_plugin)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return bool(getattr(self._trainer._backend, "step_was_skipped", False))

    # ----- collectives -----

    def gather(self, tensor):
        """Every process's tensors concatenated on dim 0 in rank order (0-d tensors become 1-d); in one process the input."""
        if not distributed.is_distributed():
            return tensor
        return collectives.apply_nested(collectives.all_gather, tensor, "gather")

    def gather_for_metrics(self, input_data, use_gather_object: bool = False):
        """gather (tensors) or gather_object (anything else). lathe's dataloaders are not accelerate's, so (as
        accelerate does for a dataloader it did not prepare) nothing is cut from the end."""
        try:
            collectives.apply_nested(lambda t: t, input_data, "gather_for_metrics")
            all_tensors = True
        except TypeError:
            all_tensors = False
        if use_gather_object or not all_tensors:
            return collectives.gather_object(input_data)
        return self.gather(input_data)

    def pad_across_processes(self, tensor, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
        """Pad `dim` to the largest size any process has (pad_index values, at the end or first)."""
        return collectives.apply_nested(
            lambda t: collectives.pad_to_largest(t, dim, pad_index, pad_first), tensor, "pad_across_processes"
        )

    def reduce(self, tensor, reduction: str = "sum", scale: float = 1.0):
        """A copy of `tensor` summed (or averaged / maximum: reduction="mean" / "max") over processes; in one process the copy,
        unscaled, as accelerate returns it."""
        return collectives.apply_nested(lambda t: collectives.reduce_copy(t, reduction), tensor, "reduce")

    def wait_for_everyone(self) -> None:
        if distributed.is_distributed():
            import torch.distributed as dist

            dist.barrier()

    @contextlib.contextmanager
    def main_process_first(self):
        yield from self._first(self.is_main_process)

    @contextlib.contextmanager
    def local_main_process_first(self):
        yield from self._first(self.is_local_main_process)

    def _first(self, is_first: bool):
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(self, inputs, apply_padding: bool = False):
        """This process's contiguous share of a list / tuple / dict of lists / tensor (accelerate's split)."""
        yield collectives.split_share(inputs, self.num_processes, self.process_index, apply_padding)

    def print(self, *args, **kwargs) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    # ----- the model and the step -----

    def unwrap_model(self, model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True):
        """The module inside DistributedDataParallel / DataParallel / a DeepSpeed engine (and inside
        torch.compile unless keep_torch_compile)."""
        while True:
            if not keep_torch_compile and hasattr(model, "_orig_mod"):
                model = model._orig_mod
            elif isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
                model = model.module
            elif type(model).__name__ == "DeepSpeedEngine":
                model = model.module
            else:
                return model

    def prepare(self, *objects, device_placement=None):
        """Objects the Trainer already prepared come back as they are; another model is moved to the device
        (prepare_model); anything accelerate would wrap for several processes is refused there."""
        prepared = tuple(self._prepare_one(obj, device_placement) for obj in objects)
        return prepared[0] if len(prepared) == 1 else prepared

    def _prepare_one(self, obj, device_placement):
        trainer = self._trainer
        if obj is None or obj is trainer.model or obj is trainer.model_wrapped:
            return obj if obj is None else trainer.model_wrapped
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=device_placement)
        if isinstance(obj, torch.utils.data.DataLoader):
            return self.prepare_data_loader(obj)
        if isinstance(obj, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)):
            if obj is trainer.optimizer or obj is trainer.lr_scheduler or not distributed.is_distributed():
                return obj
            _refuse("prepare", f"a {type(obj).__name__} the Trainer does not own, on several processes")
        return obj  # accelerate returns objects of other types unchanged

    def prepare_model(self, model, device_placement=None, evaluation_mode: bool = False):
        if model is self._trainer.model or model is self._trainer.model_wrapped:
            return self._trainer.model_wrapped
        if device_placement is not False and getattr(model, "hf_device_map", None) is None:
            model = model.to(self.device)
        if distributed.is_distributed() and not evaluation_mode and any(p.requires_grad for p in model.parameters()):
            _refuse("prepare_model", "a second trainable model on several processes (pass evaluation_mode=True)")
        return model

    def prepare_data_loader(self, data_loader, device_placement=None):
        if distributed.is_distributed():
            _refuse("prepare_data_loader", "sharding a dataloader across processes (use the Trainer's dataloaders)")
        if self._args.accelerator_config.use_seedable_sampler:  # always True on lathe (False is refused)
            from lathe.train.data.seedable import make_sampler_seedable

            make_sampler_seedable(data_loader, self._args.data_seed)
        if device_placement is False or self.device.type == "cpu":
            return data_loader
        return _DeviceLoader(data_loader, self.device)

    def backward(self, loss, **kwargs) -> None:
        """loss / gradient_accumulation_steps (1, as transformers builds it) through the run's back-end."""
        loss = loss / self.gradient_accumulation_steps
        backend = self._trainer._backend
        if kwargs:
            if type(backend).__name__ != "PlainBackend":
                _refuse("backward", f"keyword arguments {sorted(kwargs)} with the {type(backend).__name__}")
            loss.backward(**kwargs)
        else:
            backend.backward(loss)

    def autocast(self, autocast_handler=None):
        if autocast_handler is not None:
            _refuse("autocast", "an autocast_handler")
        from lathe.train import runtime

        return runtime.autocast_context(self._args, runtime.autocast_dtype(self._args))

    @contextlib.contextmanager
    def accumulate(self, *models):
        """accelerate's counter: gradients sync every gradient_accumulation_steps calls (every call here)."""
        self.step += 1
        self.gradient_state._set_sync_gradients(self.step % self.gradient_accumulation_steps == 0)
        with contextlib.ExitStack() as stack:
            for model in models:
                if not self.sync_gradients:
                    stack.enter_context(self.no_sync(model))
            yield

    def no_sync(self, model):
        return distributed.local_accumulation(model)()

    def clip_grad_norm_(self, parameters, max_norm: float, norm_type: float = 2):
        if self._args.deepspeed:
            _refuse("clip_grad_norm_", "under DeepSpeed (its engine clips)")
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # ----- saving and memory -----

    def get_state_dict(self, model, unwrap: bool = True):
        if self._args.deepspeed or self._args.fsdp:
            _refuse("get_state_dict", "a sharded model (use trainer.save_model)")
        return (self.unwrap_model(model) if unwrap else model).state_dict()

    def save(self, obj, f, safe_serialization: bool = False) -> None:
        """On the main process only (save_on_each_node: on each node's local main), as accelerate.utils.save."""
        on_each_node = bool(self._args.save_on_each_node)
        if not (self.is_local_main_process if on_each_node else self.is_main_process):
            return
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(obj, f, metadata={"format": "pt"})
        else:
            torch.save(obj, f)

    def free_memory(self, *objects):
        """accelerate's release_memory: a list of None in place of `objects`, after garbage collection."""
        released = [None] * len(objects)
        self.step = 0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return released

    clear = free_memory

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        _refuse(name, "not provided")


class _DeviceLoader:
    """A dataloader whose batches arrive on the device, as accelerate's prepared loader gives them."""

    def __init__(self, loader, device):
        self._loader, self._device = loader, device

    def __iter__(self):
        from lathe.train.runtime import move_to_device

        for batch in self._loader:
            yield move_to_device(batch, self._device)

    def __len__(self):
        return len(self._loader)

    def __getattr__(self, name):
        return getattr(self._loader, name)
