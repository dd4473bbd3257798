"""The string enums behind TrainingArguments' choice fields (strategies, schedulers, optimizers)."""

from enum import Enum


class ExplicitEnum(str, Enum):
    """A `str` enum: members compare equal to their values (`IntervalStrategy.STEPS == "steps"`).

    A bad value raises `ValueError` listing the allowed ones. `TrainingArguments` converts through
    `to_enum` below instead, so its message also names the field.
    """

    @classmethod
    def _missing_(cls, value):
        raise ValueError(f"{value!r} is not a valid {cls.__name__}; choose one of {cls.values()}")

    @classmethod
    def values(cls) -> list[str]:
        return [member.value for member in cls]

    # Printing a member gives its value ("steps"), so f-strings and logs read like the config file.
    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


def to_enum(enum_cls: type[ExplicitEnum], value, field_name: str) -> ExplicitEnum:
    """Convert `value` to `enum_cls`, or raise a ValueError naming the field and the allowed values."""
    try:
        return enum_cls(value)
    except (ValueError, TypeError):  # TypeError: an unhashable value such as a list
        raise ValueError(f"{field_name}={value!r} is not valid; choose one of {enum_cls.values()}") from None


class IntervalStrategy(ExplicitEnum):
    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


class SaveStrategy(ExplicitEnum):
    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"
    BEST = "best"


class SchedulerType(ExplicitEnum):
    """Names for `lr_scheduler_type`; `lathe.train.optim.optimizers.get_scheduler` builds each one."""

    LINEAR = "linear"
    COSINE = "cosine"
    COSINE_WITH_RESTARTS = "cosine_with_restarts"
    POLYNOMIAL = "polynomial"
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    INVERSE_SQRT = "inverse_sqrt"
    REDUCE_ON_PLATEAU = "reduce_lr_on_plateau"
    COSINE_WITH_MIN_LR = "cosine_with_min_lr"
    COSINE_WARMUP_WITH_MIN_LR = "cosine_warmup_with_min_lr"
    WARMUP_STABLE_DECAY = "warmup_stable_decay"
    GREEDY = "greedy"


class OptimizerNames(ExplicitEnum):
    """Every optimizer name transformers 5.23 accepts for `optim`.

    The full list is kept so that configs written for transformers parse; the Trainer builds the
    plain-PyTorch ones (adamw_torch, adamw_torch_fused, sgd, adagrad, rmsprop, adafactor), GaLore's
    (galore_*, from galore-torch) and APOLLO's (apollo_*, from apollo-torch), and rejects the rest when
    it creates the optimizer, naming the missing back-end.
    """

    ADAMW_TORCH = "adamw_torch"
    ADAMW_TORCH_FUSED = "adamw_torch_fused"
    ADAMW_TORCH_XLA = "adamw_torch_xla"
    ADAMW_TORCH_NPU_FUSED = "adamw_torch_npu_fused"
    ADAFACTOR = "adafactor"
    ADAMW_ANYPRECISION = "adamw_anyprecision"
    ADAMW_TORCH_4BIT = "adamw_torch_4bit"
    ADAMW_TORCH_8BIT = "adamw_torch_8bit"
    ADEMAMIX = "ademamix"
    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAMW_BNB = "adamw_bnb_8bit"
    ADAMW_8BIT = "adamw_8bit"
    ADEMAMIX_8BIT = "ademamix_8bit"
    LION_8BIT = "lion_8bit"
    LION = "lion_32bit"
    PAGED_ADAMW = "paged_adamw_32bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    PAGED_ADEMAMIX = "paged_ademamix_32bit"
    PAGED_ADEMAMIX_8BIT = "paged_ademamix_8bit"
    PAGED_LION = "paged_lion_32bit"
    PAGED_LION_8BIT = "paged_lion_8bit"
    RMSPROP = "rmsprop"
    RMSPROP_BNB = "rmsprop_bnb"
    RMSPROP_8BIT = "rmsprop_bnb_8bit"
    RMSPROP_32BIT = "rmsprop_bnb_32bit"
    GALORE_ADAMW = "galore_adamw"
    GALORE_ADAMW_8BIT = "galore_adamw_8bit"
    GALORE_ADAFACTOR = "galore_adafactor"
    GALORE_ADAMW_LAYERWISE = "galore_adamw_layerwise"
    GALORE_ADAMW_8BIT_LAYERWISE = "galore_adamw_8bit_layerwise"
    GALORE_ADAFACTOR_LAYERWISE = "galore_adafactor_layerwise"
    LOMO = "lomo"
    ADALOMO = "adalomo"
    GROKADAMW = "grokadamw"
    SCHEDULE_FREE_RADAM = "schedule_free_radam"
    SCHEDULE_FREE_ADAMW = "schedule_free_adamw"
    SCHEDULE_FREE_SGD = "schedule_free_sgd"
    APOLLO_ADAMW = "apollo_adamw"
    APOLLO_ADAMW_LAYERWISE = "apollo_adamw_layerwise"
    STABLE_ADAMW = "stable_adamw"
