"""The Trainer's optimizer: which parameters get weight decay, which optimizer class `args.optim` names, and building it."""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable

import torch
from torch import nn

from lathe.train.optim.adafactor import Adafactor
from lathe.train.optim.schedules import SCHEDULER_NAMES, get_scheduler

__all__ = [
    "OPTIMIZER_NAMES",
    "SCHEDULER_NAMES",
    "create_optimizer",
    "get_decay_parameter_names",
    "get_optimizer_cls_and_kwargs",
    "get_scheduler",
    "optimizer_state_classes",
    "parse_optim_args",
]

# Parameter names that never get weight decay, matched against the lower-cased full name, as transformers does.
_NO_DECAY_NAME = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")

# Normalisation layers by class name: LlamaRMSNorm, T5LayerNorm, BatchNorm2d, NemotronLayerNorm1P, ...RMSNormGated.
# Anchored at the end, because "Norm" inside a name (Wav2Vec2GroupNormConvLayer, InklingNormedEmbedding) marks
# a block that *contains* a norm next to conv or embedding weights that should decay.
_NORM_CLASS_NAME = re.compile(r"Norm(?:\d\w*|Gated)?$")


def _is_normalisation(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or bool(_NORM_CLASS_NAME.search(type(module).__name__))


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that get weight decay: all but biases and normalisation weights.

    Decaying a norm's scale pulls it towards 0 (not towards its neutral value 1), and decaying biases only
    adds noise, hence the exclusions. Frozen parameters are listed too; `create_optimizer` drops them.
    """
    names = []
    for module_name, module in model.named_modules(remove_duplicate=False):
        # Only a norm's *own* parameters are exempt: a block whose class ends in "Norm" may still hold Linear
        # children (DbrxNormAttentionNorm holds attention); those are visited as modules of their own.
        if _is_normalisation(module):
            continue
        prefix = f"{module_name}." if module_name else ""
        for parameter_name, _ in module.named_parameters(recurse=False):
            full_name = prefix + parameter_name
            if not _NO_DECAY_NAME.search(full_name.lower()):
                names.append(full_name)
    return names


def parse_optim_args(optim_args: str | None) -> dict[str, str]:
    """Parse TrainingArguments.optim_args, "momentum=0.9,nesterov=True", into {"momentum": "0.9", ...}."""
    if not optim_args:
        return {}
    parsed = {}
    for item in optim_args.replace(" ", "").split(","):
        if not item:
            continue
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ValueError(f"optim_args must look like 'key=value,key=value'; got item {item!r} in {optim_args!r}")
        parsed[key] = value
    return parsed


def _as_bool(text: str) -> bool:
    return text.lower() in ("true", "1", "yes")


def _read_optim_args(optim_args: dict[str, str], floats: tuple[str, ...], bools: tuple[str, ...] = ()) -> dict:
    """Convert the optim_args this optimizer understands; warn about the rest, which would otherwise vanish."""
    kwargs: dict[str, Any] = {}
    for key, value in optim_args.items():
        if key in floats:
            kwargs[key] = float(value)
        elif key in bools:
            kwargs[key] = _as_bool(value)
        else:
            warnings.warn(f"optim_args key {key!r} is not used by this optimizer; known keys: {[*floats, *bools]}")
    return kwargs


def _fused_adamw_supported(model: nn.Module | None) -> bool:
    """Whether torch's fused AdamW kernel accepts every trainable parameter (device type and floating dtype)."""
    if model is None:
        return True  # nothing to check against: let torch decide at the first step, as transformers does
    try:  # private, but it is the very list torch checks at the first step
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:
        return True
    devices = _get_fused_kernels_supported_devices()
    return all(p.device.type in devices and torch.is_floating_point(p) for p in model.parameters() if p.requires_grad)


# Each builder gets (args, parsed optim_args, model) and returns (class, kwargs). The kwargs mirror exactly what
# transformers passes, so that the same TrainingArguments give the same numbers; weight_decay is deliberately
# absent because create_optimizer sets it per parameter group.


def _adamw(args, optim_args, model):
    if optim_args:
        warnings.warn("AdamW ignores optim_args (as in transformers); set adam_beta1, adam_beta2, adam_epsilon")
    kwargs = {"lr": args.learning_rate, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
    return torch.optim.AdamW, kwargs  # foreach chosen by torch (on for CUDA tensors)


def _adamw_fused(args, optim_args, model):
    cls, kwargs = _adamw(args, optim_args, model)
    if _fused_adamw_supported(model):
        kwargs["fused"] = True
    else:
        warnings.warn("adamw_torch_fused: fused AdamW does not support these parameters; using the default kernel")
    return cls, kwargs


def _adafactor(args, optim_args, model):
    if optim_args:
        warnings.warn("optim=adafactor: optim_args are ignored (as in transformers)")
    # An external LR and schedule drive it, so Adafactor's own relative step and parameter scaling are off.
    return Adafactor, {"lr": args.learning_rate, "scale_parameter": False, "relative_step": False}


def _sgd(args, optim_args, model):
    extra = _read_optim_args(optim_args, floats=("momentum", "dampening", "weight_decay"), bools=("nesterov",))
    return torch.optim.SGD, {"lr": args.learning_rate, **extra}


def _adagrad(args, optim_args, model):
    extra = _read_optim_args(optim_args, floats=("lr_decay", "weight_decay", "eps"))
    return torch.optim.Adagrad, {"lr": args.learning_rate, **extra}


def _rmsprop(args, optim_args, model):
    extra = _read_optim_args(optim_args, floats=("momentum", "alpha", "eps", "weight_decay"), bools=("centered",))
    return torch.optim.RMSprop, {"lr": args.learning_rate, **extra}


def _target_matches(targets, module_name: str) -> tuple[bool, bool]:
    """(whether optim_target_modules selects `module_name`, whether a regex did), as transformers matches:
    a string is a regex over the whole name; a list entry matches as the name, a substring or a regex."""
    if isinstance(targets, str):
        return bool(re.fullmatch(targets, module_name)), targets != module_name
    if module_name in targets or any(target in module_name for target in targets):
        return True, False
    if any(re.fullmatch(target, module_name) for target in targets):
        return True, True
    return False, False


def check_target_module_exists(optim_target_modules, key: str, return_is_regex: bool = False):
    """transformers.trainer_utils' public form of the matching above: whether `key` is selected, and with
    `return_is_regex` also whether a regex selected it."""
    found, is_regex = _target_matches(optim_target_modules, key)
    return (found, is_regex) if return_is_regex else found


def _low_rank_groups(args, model, name: str, options: dict) -> list[dict]:
    """transformers' two groups for GaLore / APOLLO: every parameter outside the targets, then the weights of
    the nn.Linear modules optim_target_modules selects ("all-linear": all of them) with `options`."""
    targets = getattr(args, "optim_target_modules", None)
    if targets is None:
        raise ValueError(f"optim={name} needs optim_target_modules: module names, a regex, or 'all-linear'.")
    if not isinstance(targets, (str, list, tuple)):
        raise TypeError(
            f"optim_target_modules must be a list of strings, a regex string or 'all-linear'; got {targets!r}"
        )
    if model is None:
        raise ValueError(f"optim={name} needs the model to choose the parameters it projects.")
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    target_names = set()
    for module_name, module in model.named_modules():
        matched, by_regex = _target_matches(targets, module_name)
        if not isinstance(module, nn.Linear):
            if matched and not by_regex:
                warnings.warn(f"optim_target_modules matches {module_name}, which is not an nn.Linear: {name} skips it")
            continue
        if matched or all_linear:
            target_names.add(module_name + ".weight")
    if not target_names:
        raise ValueError(f"optim_target_modules={targets!r} selects no nn.Linear module of the model for optim={name}.")
    # Frozen parameters stay in the groups, as in transformers: APOLLO seeds its projections by position.
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if n not in target_names]},
        {"params": [p for n, p in named if n in target_names], **options},
    ]


def _pop_options(name: str, optim_args: dict, defaults: dict) -> dict:
    """transformers' defaults for GaLore / APOLLO, overridden by optim_args; other optim_args keys warn."""
    options = {
        key: type(default)(optim_args.pop(key)) if key in optim_args else default for key, default in defaults.items()
    }
    for key in optim_args:
        warnings.warn(f"optim_args key {key!r} is not used by optim={name}; known keys: {list(defaults)}")
    return options


def _galore(args, optim_args, model):
    from lathe.train.optim import galore

    name = str(getattr(args.optim, "value", args.optim))
    kind = "adafactor" if "adafactor" in name else "adamw_8bit" if "8bit" in name else "adamw"
    options = _pop_options(name, optim_args, {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"})
    if kind == "adamw_8bit" and model is not None and any(p.device.type != "cuda" for p in model.parameters()):
        raise ValueError(
            f"optim={name} uses bitsandbytes' 8-bit AdamW, which runs on CUDA GPUs only; the model is not on one."
        )
    optimizer_cls = galore.optimizer_class(kind, f"optim={name}")
    kwargs = {"lr": args.learning_rate, "params": _low_rank_groups(args, model, name, galore.group_options(**options))}
    if kind == "adafactor":
        kwargs.update(scale_parameter=False, relative_step=False)
    # Like transformers, adam_beta1/2, adam_epsilon and weight_decay do not reach GaLore (its defaults apply).
    return _maybe_layerwise(name, args, optimizer_cls), kwargs


def _apollo(args, optim_args, model):
    from lathe.train.optim import apollo

    name = str(getattr(args.optim, "value", args.optim))
    options = _pop_options(
        name,
        optim_args,
        {
            "rank": 128,
            "proj": "random",
            "scale_type": "channel",
            "update_proj_gap": 200,
            "scale": 1.0,
            "proj_type": "std",
        },
    )
    group = {**apollo.group_options(**options), "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
    kwargs = {"lr": args.learning_rate, "params": _low_rank_groups(args, model, name, group)}
    return _maybe_layerwise(name, args, apollo.optimizer_class(f"optim={name}")), kwargs


def _maybe_layerwise(name: str, args, optimizer_cls):
    if not name.endswith("layerwise"):
        return optimizer_cls
    from lathe.train.optim.layerwise import PerParameter

    if args.gradient_accumulation_steps != 1:
        raise ValueError(
            f"optim={name} steps each parameter inside the backward pass, so gradient_accumulation_steps must be 1."
        )
    if args.world_size > 1:
        raise ValueError(
            f"optim={name} does not work with several processes: DDP would reduce gradients its hooks already used."
        )
    return PerParameter(optimizer_cls)


_BUILDERS: dict[str, Callable] = {
    "adamw_torch": _adamw,
    "adamw_torch_fused": _adamw_fused,
    "adafactor": _adafactor,
    "sgd": _sgd,
    "adagrad": _adagrad,
    "rmsprop": _rmsprop,
    **dict.fromkeys(
        (
            "galore_adamw",
            "galore_adamw_8bit",
            "galore_adafactor",
            "galore_adamw_layerwise",
            "galore_adamw_8bit_layerwise",
            "galore_adafactor_layerwise",
        ),
        _galore,
    ),
    "apollo_adamw": _apollo,
    "apollo_adamw_layerwise": _apollo,
}

OPTIMIZER_NAMES = tuple(_BUILDERS)


def get_optimizer_cls_and_kwargs(args, model: nn.Module | None = None) -> tuple[type, dict[str, Any]]:
    """The optimizer class and constructor kwargs (without params) for `args.optim`.

    `args` is read by attribute name only (optim, optim_args, learning_rate, adam_beta1, adam_beta2, adam_epsilon),
    so any TrainingArguments-like object works. `model`, when given, lets adamw_torch_fused check its parameters.
    """
    name = getattr(args.optim, "value", args.optim)  # OptimizerNames members or plain strings
    builder = _BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unsupported optim={name!r}; supported optimizers are {list(OPTIMIZER_NAMES)}")
    return builder(args, parse_optim_args(getattr(args, "optim_args", None)), model)


def create_optimizer(
    model: nn.Module, args, optimizer_cls_and_kwargs: tuple[type, dict[str, Any]] | None = None
) -> torch.optim.Optimizer:
    """Build the optimizer for the trainable parameters of `model`, in two groups.

    Group 0: weight-decayed parameters (args.weight_decay); group 1: biases and norms (0.0). Both groups are
    kept even when one is empty, as transformers keeps them: the optimizer's state_dict then has the same
    groups in both libraries, so checkpoints cross-resume for any model. `optimizer_cls_and_kwargs` overrides
    what `args.optim` names (the Trainer's argument of the same name).
    """
    if optimizer_cls_and_kwargs is None:
        optimizer_cls_and_kwargs = get_optimizer_cls_and_kwargs(args, model)
    optimizer_cls, optimizer_kwargs = optimizer_cls_and_kwargs
    optimizer_kwargs = dict(optimizer_kwargs)
    if "params" in optimizer_kwargs:  # the optimizer chose its own groups (GaLore, APOLLO), as in transformers
        return optimizer_cls(optimizer_kwargs.pop("params"), **optimizer_kwargs)

    decay_names = set(get_decay_parameter_names(model))
    decay, no_decay = [], []
    # named_parameters() yields a tied parameter once, so it never lands in the optimizer twice.
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (decay if name in decay_names else no_decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if not decay and not no_decay:
        raise ValueError("create_optimizer: the model has no parameters with requires_grad=True")
    if getattr(args, "deepspeed", None):
        # ZeRO leaves an empty group out of the optimizer it wraps, and the schedule built on both groups then
        # no longer fits; DeepSpeed's checkpoints are its own format, so the plain layout is not at stake there.
        groups = [group for group in groups if group["params"]]
    return optimizer_cls(groups, **optimizer_kwargs)


def optimizer_state_classes(optimizer) -> list[type]:
    """Classes other than tensors and containers in `optimizer`'s state_dict, which loading a checkpoint
    must allow (torch.load(weights_only=True)): GaLore's and APOLLO's gradient projectors."""
    from lathe.train.optim.layerwise import is_layerwise

    inner = list(optimizer.optimizer_dict.values()) if is_layerwise(optimizer) else [optimizer]
    packages = {type(each).__module__.split(".")[0] for each in inner}
    classes = []
    if "galore_torch" in packages:
        from lathe.train.optim import galore

        classes += galore.state_classes()
    if "apollo_torch" in packages:
        from lathe.train.optim import apollo

        classes += apollo.state_classes()
    return classes
