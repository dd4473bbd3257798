"""Where and how the model runs: device placement, autocast precision, the fp16 GradScaler,
gradient clipping, gradient checkpointing and torch.compile, and the process's log level. The loop never
branches on these itself."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch

from lathe.utils import logging as lathe_logging

NO_CONTEXT = contextlib.nullcontext()  # reusable: made once, not on every micro-batch


def move_to_device(data, device: torch.device):
    """Move tensors (nested in dicts, lists, tuples) to `device`; non-blocking when pinned."""
    if torch.is_tensor(data):
        return data.to(device, non_blocking=True) if data.device != device else data
    if isinstance(data, Mapping):
        return type(data)({k: move_to_device(v, device) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        moved = [move_to_device(v, device) for v in data]
        return type(data)(*moved) if hasattr(data, "_fields") else type(data)(moved)
    return data


def autocast_dtype(args) -> torch.dtype | None:
    if args.deepspeed:
        return None  # DeepSpeed's engine casts the model itself (its fp16 / bf16 sections)
    if args.bf16:
        return torch.bfloat16
    if args.fp16:
        return torch.float16
    return None


def autocast_context(args, dtype: torch.dtype | None):
    """Mixed precision through torch.autocast (weights stay fp32; the optimizer sees fp32). The device
    is looked up only under autocast: args.device checks for a process group, on every micro-batch."""
    if dtype is None:
        return NO_CONTEXT
    return torch.autocast(device_type=args.device.type, dtype=dtype)


def make_grad_scaler(args, device: torch.device):
    """fp16 needs loss scaling to keep small gradients from underflowing; bf16 does not."""
    if not args.fp16 or args.deepspeed:
        return None  # DeepSpeed scales fp16 losses itself
    return torch.amp.GradScaler(device.type)


def clip_gradients(parameters, max_norm: float, sparse: bool = False) -> torch.Tensor:
    """Clip to max_norm and return the total norm *before* clipping (what is logged as grad_norm).

    sparse: some gradients are sparse tensors (BAdam's ratio mode), which torch's foreach norm cannot
    take: the norm is then taken tensor by tensor, as torch computed it before foreach kernels."""
    if not sparse:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    gradients = [p.grad for p in parameters if p.grad is not None]
    if not gradients:
        return torch.tensor(0.0)
    total = torch.norm(torch.stack([torch.norm(g.detach(), 2.0) for g in gradients]), 2.0)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for gradient in gradients:
        gradient.detach().mul_(coefficient.to(gradient.device))
    return total


def clear_gradients(parameters: list) -> None:
    """model.zero_grad(set_to_none=True) over a list made once: Module.zero_grad walks the module
    tree on every call (~0.1 ms per step for a small MLP, a tenth of its whole step)."""
    for parameter in parameters:
        parameter.grad = None


def enable_gradient_checkpointing(model, kwargs: dict | None) -> None:
    """transformers 5 calls it activation checkpointing (gradient_checkpointing_enable is its deprecated
    alias, which warns). every_n_layers and offload are options of that method, not of
    torch.utils.checkpoint, so they come out of kwargs; the rest go to torch.utils.checkpoint."""
    options = dict(kwargs or {})
    layer_options = {name: options.pop(name) for name in ("every_n_layers", "offload") if name in options}
    checkpoint_kwargs = options or {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint_kwargs, **layer_options)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs, **layer_options)
    else:
        raise ValueError(
            f"gradient_checkpointing=True, but {type(model).__name__} has neither activation_checkpointing_enable() "
            "nor gradient_checkpointing_enable() (transformers models have them). Remove the option or implement one."
        )
    # With frozen embeddings, checkpointed blocks would get inputs without grad and skip backward.
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()


def compile_model(model, args):
    kwargs = {}
    if getattr(args, "torch_compile_backend", None):
        kwargs["backend"] = args.torch_compile_backend
    if getattr(args, "torch_compile_mode", None):
        kwargs["mode"] = args.torch_compile_mode
    return torch.compile(model, **kwargs)


def is_out_of_memory(error: BaseException) -> bool:
    """An error that a smaller batch may fix (CUDA/MPS/CPU allocation failures)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    message = str(error)
    return isinstance(error, RuntimeError) and any(
        marker in message
        for marker in ("out of memory", "CUDNN_STATUS_NOT_SUPPORTED", "DefaultCPUAllocator: can't allocate memory")
    )


def barrier() -> None:
    """Wait for every process when torch.distributed is running; a no-op in a single process."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()


def apply_log_level(args) -> None:
    """log_level / log_level_replica, as transformers' Trainer applies them to its library logger: the
    level of the "lathe" logger. Like transformers' default handler, messages then reach stderr even where
    the program configured no logging; 'passive' leaves everything as it is."""
    name = args.log_level if args.should_log else args.log_level_replica
    if name == "passive":
        return
    lathe_logging.set_verbosity(args.get_process_log_level())


def tf32_available() -> bool:
    """TF32 matrix multiplies need an Ampere (compute capability 8) or newer CUDA GPU."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False
    return torch.cuda.get_device_properties(torch.cuda.current_device()).major >= 8


def apply_tf32(args) -> None:
    """tf32=True / False switches TF32 matmuls on / off for the process (transformers does it when the
    arguments are made; lathe when the Trainer is); None leaves torch's setting alone. TrainingArguments
    refuses tf32=True where TF32 is not available."""
    if args.tf32 is None or not tf32_available():
        return  # without TF32 hardware there is nothing to switch off
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.fp32_precision = "tf32" if args.tf32 else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(args.tf32)


def maybe_empty_device_cache(args, global_step: int) -> None:
    """torch_empty_cache_steps: after the forward of every micro-batch of each N-th step, as transformers."""
    if args.torch_empty_cache_steps is not None and global_step % args.torch_empty_cache_steps == 0:
        empty_device_cache()


def empty_device_cache() -> None:
    """torch_empty_cache_steps: return the accelerator's cached, unused memory (nothing to do on the CPU)."""
    for name in ("cuda", "xpu", "mps", "npu", "mlu", "musa"):
        backend = getattr(torch, name, None)
        if backend is not None and backend.is_available():
            backend.empty_cache()
            if name == "mps" and hasattr(torch.mps, "clear_graph_cache"):
                torch.mps.clear_graph_cache()
            return


def full_eval_dtype(args) -> torch.dtype | None:
    """fp16_full_eval / bf16_full_eval: evaluate with the whole model cast to that dtype (outside train())."""
    return torch.float16 if args.fp16_full_eval else torch.bfloat16 if args.bf16_full_eval else None


def autocast_smart_context_manager(trainer, cache_enabled: bool | None = True):
    """transformers' hook around the forward pass; its autocast comes from accelerate, so this returns a null
    context there, and here too: lathe's autocast (bf16 / fp16) is entered by training_step and prediction_step
    themselves. Override it to wrap every forward in a context of your own."""
    return contextlib.nullcontext()


def compute_loss_context_manager(trainer) -> contextlib.ExitStack:
    """The contexts compute_loss runs in (training_step and prediction_step enter it)."""
    stack = contextlib.ExitStack()
    context = trainer.autocast_smart_context_manager()
    if not isinstance(context, contextlib.nullcontext):
        stack.enter_context(context)
    engine = getattr(trainer, "_zero_engine", None)
    if engine is not None and engine.zero_optimization_stage() == 3:  # the forward gathers the weights
        from lathe.train.parallel.quiet_collectives import quiet_collectives

        stack.enter_context(quiet_collectives())
    return stack
