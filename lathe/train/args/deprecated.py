"""transformers 4 names of TrainingArguments that transformers 5 removed or renamed: each is moved into the
field that took over (or dropped) with a FutureWarning that points at the user's line."""

import os
import sys
import warnings
from dataclasses import MISSING, fields

# Frames skipped when a warning picks the line to blame: this package's argument modules and the
# dataclass-generated __init__ (whose file name is "<string>").
_HERE = os.path.dirname(__file__)
_OWN_FILES = tuple(os.path.join(_HERE, name) for name in ("training_args.py", "validation.py", "deprecated.py"))


def map_deprecated_names(args) -> None:
    """Move each deprecated 4.x field into its 5.x field with a FutureWarning, then reset it to None,
    so that copies of the arguments neither warn again nor see a conflict."""
    _map_renamed_fields(args, _field_defaults(args))
    _drop_removed_fields(args)


def _map_renamed_fields(args, defaults: dict) -> None:
    if args.evaluation_strategy is not None:
        _rename(args, defaults, "evaluation_strategy", "eval_strategy", yaml_no(args.evaluation_strategy))
    if args.warmup_ratio is not None:
        if not 0 <= args.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio={args.warmup_ratio} must be in [0, 1); for a step count use warmup_steps.")
        _rename(args, defaults, "warmup_ratio", "warmup_steps", args.warmup_ratio)
    if args.no_cuda is not None:
        _rename(args, defaults, "no_cuda", "use_cpu", bool(args.no_cuda))
    if args.group_by_length is not None:
        if args.group_by_length:
            _rename(args, defaults, "group_by_length", "train_sampling_strategy", "group_by_length")
        elif args.train_sampling_strategy == "group_by_length":
            raise ValueError(
                "group_by_length=False (deprecated) contradicts train_sampling_strategy='group_by_length'; "
                "set only train_sampling_strategy."
            )
        else:
            _warn_renamed("group_by_length", "train_sampling_strategy")
            args.group_by_length = None


def _drop_removed_fields(args) -> None:
    if args.overwrite_output_dir is not None:
        warn_from_user_code(
            "`overwrite_output_dir` was removed in transformers 5 and is ignored: output_dir is always reused."
        )
        args.overwrite_output_dir = None
    if args.save_safetensors is not None:
        if args.save_safetensors:
            warn_from_user_code(
                "`save_safetensors` was removed in transformers 5: weights are always saved as safetensors."
            )
        else:
            warn_from_user_code("`save_safetensors=False` is ignored: lathe always saves weights as safetensors.")
        args.save_safetensors = None
    if args.logging_dir is not None:
        # Kept (not reset): the TensorBoard reporter writes there. Only portability is at stake.
        warn_from_user_code(
            "`logging_dir` was removed in transformers 5; lathe still passes it to the tensorboard reporter, "
            "but code that sets it will not run on transformers 5."
        )
        args.logging_dir = os.path.expanduser(args.logging_dir)


def _rename(args, defaults: dict, old: str, new: str, value) -> None:
    current = getattr(args, new)
    if current != defaults[new] and current != value:
        raise ValueError(f"{old}={getattr(args, old)!r} (deprecated) and {new}={current!r} disagree; set only {new}.")
    _warn_renamed(old, new)
    setattr(args, new, value)
    setattr(args, old, None)


def _warn_renamed(old: str, new: str) -> None:
    warn_from_user_code(f"`{old}` was removed in transformers 5; use `{new}` instead.")


def warn_from_user_code(message: str) -> None:
    # Point at the user's line that built the arguments, however deep inside __post_init__ we are.
    frame, level = sys._getframe(0), 1
    while frame is not None and (frame.f_code.co_filename in _OWN_FILES or frame.f_code.co_filename.startswith("<")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, FutureWarning, stacklevel=level)


def _field_defaults(args) -> dict:
    return {
        f.name: f.default if f.default is not MISSING else f.default_factory()
        for f in fields(args)
        if f.default is not MISSING or f.default_factory is not MISSING
    }


def yaml_no(value):
    # YAML 1.1 reads an unquoted `no` as False; for a strategy field it can only have meant "no".
    return "no" if value is False else value
