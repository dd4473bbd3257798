"""FSDP2 (`torch.distributed.fsdp.fully_shard`): the model's blocks and then the whole model sharded
over the processes, and the state dicts that go in and out of checkpoints.

Settings come from TrainingArguments `fsdp` / `fsdp_config`, read as transformers 5 reads them (its
FSDP2 keys; a leading "fsdp_" is dropped): transformer_layer_cls_to_wrap (else the model's
`_no_split_modules`), auto_wrap_policy, min_num_params, reshard_after_forward, cpu_offload,
activation_checkpointing, state_dict_type. bf16/fp16 give the mixed precision policy (parameters in
the low precision for compute, gradients reduced in fp32), as accelerate does for FSDP2.

Why N processes train what one does: fully_shard reduce-scatters the *mean* of the ranks'
gradients, as DDP all-reduces it, so the Trainer's step maths (lathe.train.parallel.distributed) applies
unchanged. Checkpoints hold full tensors (the same model.safetensors as one process writes, and
an optimizer state keyed like a single process's), gathered with torch.distributed.checkpoint's
state_dict helpers: a checkpoint resumes under any number of processes, with or without FSDP.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: torch is imported where FSDP2 is used
    import torch

logger = logging.getLogger(__name__)

WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
# Checkpoints hold full tensors (see gather_state); a sharded torch.distributed.checkpoint layout is not written.
STATE_DICT_TYPES = ("FULL_STATE_DICT",)
# transformers' fsdp_config keys that mean something for FSDP2 (xla* are for torch_xla, not here).
_KEYS = (
    "version",
    "transformer_layer_cls_to_wrap",
    "auto_wrap_policy",
    "min_num_params",
    "reshard_after_forward",
    "cpu_offload",
    "activation_checkpointing",
    "state_dict_type",
    "cpu_ram_efficient_loading",
)
_FSDP1_ONLY = ("backward_prefetch", "forward_prefetch", "use_orig_params", "sync_module_states", "limit_all_gathers")


@dataclass(frozen=True)
class FsdpSettings:
    layer_classes: tuple[str, ...] | None = None  # None: the model's _no_split_modules
    auto_wrap_policy: str = "TRANSFORMER_BASED_WRAP"
    min_num_params: int = 0
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    state_dict_type: str = "FULL_STATE_DICT"


def settings_from_args(args) -> FsdpSettings | None:
    """The FSDP settings of TrainingArguments (None when `fsdp` is off), validated: an unknown key or
    value is an error naming it and what is expected."""
    if not args.fsdp:
        return None
    if args.save_on_each_node:
        raise ValueError(
            "save_on_each_node=True cannot be used with fsdp: the full weights and optimizer state are gathered to "
            "the first process only, so only its node can write checkpoints. Save to a filesystem every node "
            "shares (save_on_each_node=False), or train with DDP."
        )
    options = _options_from_string(args.fsdp)
    options.update(_checked_config(_read_config(args.fsdp_config)))
    if int(options.pop("version", 2)) != 2:
        raise ValueError(
            "fsdp_config['version'] must be 2: lathe shards with FSDP2 (torch.distributed.fsdp.fully_shard) only."
        )
    options.pop("cpu_ram_efficient_loading", None)  # every rank builds the model; nothing to save here
    layers = options.pop("transformer_layer_cls_to_wrap", None)
    if layers is not None:
        options["layer_classes"] = tuple([layers] if isinstance(layers, str) else layers)
    for key in ("reshard_after_forward", "cpu_offload", "activation_checkpointing"):
        if key in options:
            options[key] = _as_bool(options[key], key)
    _check_choice(options, "auto_wrap_policy", WRAP_POLICIES)
    _check_choice(options, "state_dict_type", STATE_DICT_TYPES)
    if "min_num_params" in options:
        options["min_num_params"] = int(options["min_num_params"])
    return FsdpSettings(**options)


def _options_from_string(fsdp) -> dict:
    """transformers' legacy option string (fsdp="full_shard offload auto_wrap") as FSDP2 settings."""
    options = {}
    if not isinstance(fsdp, str) or fsdp.strip().lower() in ("true", "1"):
        return options
    for item in fsdp.split():
        if item == "offload":
            options["cpu_offload"] = True
        elif item in ("full_shard", "shard_grad_op"):
            options["reshard_after_forward"] = item == "full_shard"
        elif item != "auto_wrap":
            raise ValueError(
                f"fsdp={fsdp!r}: {item!r} is an FSDP1 option; FSDP2 (fully_shard) takes full_shard, "
                "shard_grad_op, offload or auto_wrap (or fsdp=True with fsdp_config)."
            )
    return options


def _checked_config(config: dict) -> dict:
    for key in config:
        if key in _FSDP1_ONLY:
            raise ValueError(
                f"fsdp_config[{key!r}] is an FSDP1 setting; lathe shards with FSDP2 (fully_shard), which has no such option. Remove it."
            )
        if key not in _KEYS:
            close = difflib.get_close_matches(key, _KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(_KEYS)}"
            raise ValueError(f"fsdp_config has an unknown key {key!r}{hint}")
    return config


def _read_config(config) -> dict:
    if config is None:
        return {}
    if isinstance(config, str):
        if not os.path.isfile(config):
            raise ValueError(f"fsdp_config={config!r} is neither a dict nor the path of a JSON file.")
        with open(config, encoding="utf-8") as f:
            config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"fsdp_config must be a dict (or a JSON file holding one), got {type(config).__name__}.")
    return {(key[5:] if key.startswith("fsdp_") else key): value for key, value in config.items()}


def _as_bool(value, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"fsdp_config[{key!r}] must be true or false, got {value!r}.")


def _check_choice(options: dict, key: str, choices) -> None:
    if key in options:
        options[key] = str(options[key]).upper()
        if options[key] not in choices:
            raise ValueError(f"fsdp_config[{key!r}]={options[key]!r} is not valid; choose one of {list(choices)}.")


# ----- sharding -----


def shard_model(model: "torch.nn.Module", args, settings: FsdpSettings) -> "torch.nn.Module":
    """fully_shard each block, then the root (which keeps what no block holds: embeddings, head,
    norms). In place: the model's parameters become DTensor shards; returns the model."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(args.device.type, (dist.get_world_size(),))
    options = {"mesh": mesh, "reshard_after_forward": settings.reshard_after_forward}
    low_precision = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    if low_precision is not None:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=low_precision, reduce_dtype=torch.float32)
    if settings.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    blocks = find_blocks(model, settings)
    if settings.activation_checkpointing:
        # The composable checkpoint keeps parameter names (a CheckpointWrapper would prefix them).
        from torch.distributed._composable import checkpoint

        for block in blocks:
            checkpoint(block)
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    logger.info("FSDP2: %d blocks and the root sharded over %d processes.", len(blocks), dist.get_world_size())
    return model


def find_blocks(model: "torch.nn.Module", settings: FsdpSettings) -> list["torch.nn.Module"]:
    """The submodules sharded on their own, outermost first within the policy."""
    if settings.auto_wrap_policy == "NO_WRAP":
        return []
    if settings.auto_wrap_policy == "SIZE_BASED_WRAP":
        return _blocks_by_size(model, settings.min_num_params)
    names = settings.layer_classes or tuple(getattr(model, "_no_split_modules", None) or ())
    present = {type(module).__name__ for module in model.modules()}
    missing = [name for name in names if name not in present]
    if missing and settings.layer_classes:
        raise ValueError(
            f"fsdp_config['transformer_layer_cls_to_wrap'] names {missing}, but {type(model).__name__} has no "
            f"module of that class. Its module classes: {sorted(present)}."
        )
    blocks = [module for module in model.modules() if module is not model and type(module).__name__ in names]
    if not blocks:
        logger.info(
            "FSDP2: no block classes to shard separately in %s (set fsdp_config['transformer_layer_cls_to_wrap']); "
            "the whole model is one unit.",
            type(model).__name__,
        )
    return blocks


def _blocks_by_size(model: "torch.nn.Module", min_num_params: int) -> list["torch.nn.Module"]:
    """Innermost-first: a submodule whose parameters not yet in a smaller unit reach min_num_params."""
    taken: set[int] = set()
    blocks = []

    def visit(module):
        for child in module.children():
            visit(child)
        if module is model:
            return
        free = [p for p in module.parameters() if id(p) not in taken]
        if free and sum(p.numel() for p in free) >= max(min_num_params, 1):
            blocks.append(module)
            taken.update(id(p) for p in free)

    visit(model)
    return blocks


@contextlib.contextmanager
def whole_weights(model, reshard_after_forward: bool):
    """Every FSDP2 module of `model` unsharded for the duration and kept whole across forwards, so that
    forwards run without collectives (generation, where ranks finish at different steps); resharded
    after, with `reshard_after_forward` (the sharding setting) restored."""
    from torch.distributed.fsdp import FSDPModule

    modules = [module for module in model.modules() if isinstance(module, FSDPModule)]
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(reshard_after_forward, recurse=False)


def is_sharded(model) -> bool:
    """Whether fully_shard was applied to the model (without importing FSDP in a plain run)."""
    import sys

    module = sys.modules.get("torch.distributed.fsdp")
    return module is not None and isinstance(model, module.FSDPModule)


# ----- checkpoint state (collectives: every rank calls them) -----


def _options(**extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **extra)


def gather_state(model, optimizer=None) -> tuple[dict, dict | None]:
    """The full weights and optimizer state on CPU on rank 0 (empty dicts elsewhere). The optimizer
    state is keyed like a single process's optimizer.state_dict() (parameters by index, in
    param_groups order), so its optimizer.pt resumes under any number of processes, sharded or not."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    # Tied weights come back as separate full copies; keep one name, as a single process's save does.
    weights = {
        name: tensor
        for name, tensor in get_model_state_dict(model, options=_options()).items()
        if name not in tied_aliases(model)
    }
    if optimizer is None:
        return weights, None
    by_name = get_optimizer_state_dict(model, optimizer, options=_options())
    if not by_name:
        return weights, {}
    index = {name: i for i, name in enumerate(name for group in by_name["param_groups"] for name in group["params"])}
    return weights, {
        "state": {index[name]: value for name, value in by_name["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]} for group in by_name["param_groups"]
        ],
    }


def tied_aliases(model) -> set[str]:
    """The second and later names of parameters shared between modules (tied embeddings)."""
    return {name for name, _ in model.named_parameters(remove_duplicate=False)} - {
        name for name, _ in model.named_parameters()
    }


def load_state(model, weights: dict, optimizer=None, optimizer_state: dict | None = None):
    """Rank 0's full weights (and optimizer state as gather_state writes it, or as one process saves
    it) into the sharded model and its optimizer; the other ranks pass empty dicts and receive theirs
    by broadcast. Returns the (missing, unexpected) weight names; tied aliases are not missing."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    # strict=False: transformers leaves tied weights out of its files; the caller checks what is missing.
    incompatible = set_model_state_dict(model, weights, options=_options(broadcast_from_rank0=True, strict=False))
    aliases = tied_aliases(model)
    incompatible = ([name for name in incompatible[0] if name not in aliases], list(incompatible[1]))
    if optimizer is None:
        return incompatible
    by_name = {}
    if optimizer_state:
        names = {id(parameter): name for name, parameter in model.named_parameters()}
        ordered = [names[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
        saved = [i for group in optimizer_state["param_groups"] for i in group["params"]]
        if len(saved) != len(ordered):
            raise ValueError(
                f"The checkpoint's optimizer state covers {len(saved)} parameters, this optimizer has "
                f"{len(ordered)}: it was saved for another model or another set of trainable parameters."
            )
        by_name = {
            "state": {ordered[i]: value for i, value in optimizer_state["state"].items()},
            "param_groups": [
                {**group, "params": [ordered[i] for i in group["params"]]} for group in optimizer_state["param_groups"]
            ],
        }
    set_optimizer_state_dict(model, optimizer, by_name, options=_options(broadcast_from_rank0=True))
    return incompatible


def adapter_weights_by_name(model, folder: str) -> dict:
    """A PEFT checkpoint's adapter_model.safetensors keyed by the wrapped model's parameter names: PEFT
    drops the adapter's name from its file (lora_A.weight for lora_A.default.weight), and the
    state-dict loading above needs the model's names."""
    from safetensors.torch import load_file

    adapter = getattr(model, "active_adapter", "default")
    by_file_name = {name.replace(f".{adapter}.", "."): name for name in model.state_dict()}
    saved = load_file(os.path.join(folder, "adapter_model.safetensors"))
    unknown = [name for name in saved if name not in by_file_name]
    if unknown:
        raise ValueError(
            f"{folder}: adapter weights {unknown[:5]} match no parameter of {type(model).__name__} "
            f"(adapter {adapter!r}): the checkpoint was written for another model or adapter."
        )
    return {by_file_name[name]: tensor for name, tensor in saved.items()}
