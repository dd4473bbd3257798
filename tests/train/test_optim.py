"""Tests for lathe.train.optim.optimizers, lathe.train.optim.schedules and lathe.train.optim.adafactor."""

from __future__ import annotations

import copy
import enum
import pickle
import warnings
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from lathe.train.optim.adafactor import Adafactor
from lathe.train.optim.optimizers import (
    OPTIMIZER_NAMES,
    create_optimizer,
    get_decay_parameter_names,
    get_optimizer_cls_and_kwargs,
    get_scheduler,
    parse_optim_args,
)
from lathe.train.optim.schedules import SCHEDULER_NAMES, cosine_factor, linear_factor


@dataclass
class Args:
    """Stands in for TrainingArguments: only the fields the optimizer code reads."""

    optim: str = "adamw_torch"
    optim_args: str | None = None
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8


BASE_LR = 0.5
WARMUP, TOTAL = 4, 20


def make_optimizer(lr: float = BASE_LR) -> torch.optim.Optimizer:
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)


def lrs_over_run(scheduler, steps: int = TOTAL + 3) -> list[float]:
    """The LR used by each optimizer step, as the Trainer sees it: read, step the optimizer, step the scheduler."""
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return lrs


# (name, scheduler_specific_kwargs): every schedule, several with non-default options.
SCHEDULE_CASES = [
    ("linear", {}),
    ("cosine", {}),
    ("cosine", {"num_cycles": 1.5}),
    ("cosine_with_restarts", {"num_cycles": 3}),
    ("polynomial", {}),
    ("polynomial", {"lr_end": 1e-2, "power": 2.0}),
    ("constant", {}),
    ("constant_with_warmup", {}),
    ("inverse_sqrt", {}),
    ("inverse_sqrt", {"timescale": 7}),
    ("cosine_with_min_lr", {"min_lr": 0.1}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.05, "num_cycles": 0.25}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", {"min_lr": 0.05, "warmup_lr_rate": 0.2}),
    ("warmup_stable_decay", {"num_decay_steps": 6}),
    (
        "warmup_stable_decay",
        {"num_decay_steps": 5, "warmup_type": "cosine", "decay_type": "1-sqrt", "min_lr_ratio": 0.1},
    ),
    (
        "warmup_stable_decay",
        {"num_decay_steps": 5, "num_stable_steps": 8, "warmup_type": "1-sqrt", "decay_type": "linear"},
    ),
]


def case_id(case):
    name, kwargs = case
    return name + "".join(f"-{k}={v}" for k, v in kwargs.items())


# --- schedules against transformers -----------------------------------------------------------------------


@pytest.mark.hf
@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=case_id)
def test_schedule_matches_transformers_at_every_step(case):
    hf_optimization = pytest.importorskip("transformers.optimization")
    name, kwargs = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # wsd warns when given both num_training_steps and num_stable_steps
        ours = get_scheduler(name, make_optimizer(), WARMUP, TOTAL, dict(kwargs))
        theirs = hf_optimization.get_scheduler(name, make_optimizer(), WARMUP, TOTAL, dict(kwargs))
    assert lrs_over_run(ours) == pytest.approx(lrs_over_run(theirs), rel=1e-12, abs=1e-15)


@pytest.mark.hf
def test_every_transformers_schedule_is_covered():
    trainer_utils = pytest.importorskip("transformers.trainer_utils")
    theirs = {member.value for member in trainer_utils.SchedulerType}
    assert theirs == set(SCHEDULER_NAMES)


# --- schedules in closed form ------------------------------------------------------------------------------


def test_linear_closed_form():
    lrs = lrs_over_run(get_scheduler("linear", make_optimizer(), WARMUP, TOTAL))
    assert lrs[0] == 0.0
    assert lrs[WARMUP // 2] == pytest.approx(BASE_LR / 2)  # half-way through warmup
    assert lrs[WARMUP] == pytest.approx(BASE_LR)
    assert lrs[(WARMUP + TOTAL) // 2] == pytest.approx(BASE_LR / 2)  # half-way through the decay
    assert lrs[TOTAL:] == [0.0, 0.0, 0.0]  # and it stays at 0 past the end
    assert linear_factor(12, num_warmup_steps=4, num_training_steps=20) == 0.5


def test_cosine_closed_form():
    lrs = lrs_over_run(get_scheduler("cosine", make_optimizer(), WARMUP, TOTAL))
    assert lrs[WARMUP] == pytest.approx(BASE_LR)
    assert lrs[(WARMUP + TOTAL) // 2] == pytest.approx(BASE_LR / 2)
    assert lrs[TOTAL] == pytest.approx(0.0, abs=1e-15)
    assert cosine_factor(12, num_warmup_steps=4, num_training_steps=20, min_lr_rate=0.2) == pytest.approx(0.6)


def test_cosine_with_min_lr_ends_at_min_lr():
    scheduler = get_scheduler("cosine_with_min_lr", make_optimizer(), WARMUP, TOTAL, {"min_lr": 0.1})
    lrs = lrs_over_run(scheduler)
    assert lrs[WARMUP] == pytest.approx(BASE_LR)
    assert lrs[TOTAL] == pytest.approx(0.1)
    assert min(lrs[WARMUP:]) == pytest.approx(0.1)


def test_constant_restarts_polynomial_inverse_sqrt_and_wsd_closed_form():
    assert lrs_over_run(get_scheduler("constant", make_optimizer())) == [BASE_LR] * (TOTAL + 3)

    warm = lrs_over_run(get_scheduler("constant_with_warmup", make_optimizer(), WARMUP))
    assert warm[:WARMUP] == pytest.approx([0.0, 0.125, 0.25, 0.375]) and set(warm[WARMUP:]) == {BASE_LR}

    # 2 cycles over 16 decay steps: back to the full LR at the start of each 8-step cycle.
    restarts = lrs_over_run(get_scheduler("cosine_with_restarts", make_optimizer(), WARMUP, TOTAL, {"num_cycles": 2}))
    assert restarts[WARMUP] == restarts[WARMUP + 8] == pytest.approx(BASE_LR)
    assert restarts[WARMUP + 4] == pytest.approx(BASE_LR / 2)

    poly = lrs_over_run(get_scheduler("polynomial", make_optimizer(), WARMUP, TOTAL, {"lr_end": 0.1}))
    assert poly[(WARMUP + TOTAL) // 2] == pytest.approx(0.3)  # power 1: straight line from 0.5 to 0.1
    assert poly[TOTAL:] == pytest.approx([0.1] * 3)

    inverse = lrs_over_run(get_scheduler("inverse_sqrt", make_optimizer(), WARMUP), steps=17)
    assert inverse[WARMUP] == pytest.approx(BASE_LR)
    assert inverse[16] == pytest.approx(BASE_LR / 2)  # timescale = warmup = 4: 1/sqrt(16/4)

    wsd_kwargs = {"num_decay_steps": 6, "min_lr_ratio": 0.2, "decay_type": "linear"}
    wsd = lrs_over_run(get_scheduler("warmup_stable_decay", make_optimizer(), WARMUP, TOTAL, wsd_kwargs))
    assert wsd[0] == pytest.approx(0.2 * BASE_LR)  # wsd warms up from min_lr_ratio, not from 0
    assert wsd[WARMUP : TOTAL - 6] == pytest.approx([BASE_LR] * 10)
    assert wsd[TOTAL - 3] == pytest.approx(BASE_LR * (0.2 + 0.8 * 0.5))
    assert wsd[TOTAL:] == pytest.approx([0.2 * BASE_LR] * 3)


def test_reduce_lr_on_plateau_uses_scheduler_specific_kwargs():
    scheduler = get_scheduler(
        "reduce_lr_on_plateau", make_optimizer(), scheduler_specific_kwargs={"factor": 0.5, "patience": 0}
    )
    assert isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    scheduler.step(1.0)
    scheduler.step(2.0)  # no improvement, patience 0: halve
    assert scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(BASE_LR / 2)


def test_scheduler_name_may_be_a_str_enum():
    class SchedulerType(str, enum.Enum):
        COSINE = "cosine"

    scheduler = get_scheduler(SchedulerType.COSINE, make_optimizer(), WARMUP, TOTAL)
    assert lrs_over_run(scheduler)[WARMUP] == pytest.approx(BASE_LR)


# --- scheduler errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cosine_warm", "Linear"])
def test_unsupported_scheduler_lists_valid_names(name):
    with pytest.raises(ValueError, match=f"unsupported lr scheduler '{name}'") as error:
        get_scheduler(name, make_optimizer(), WARMUP, TOTAL)
    for name in SCHEDULER_NAMES:
        assert name in str(error.value)


@pytest.mark.parametrize(
    "name, warmup, total, kwargs, message",
    [
        ("linear", None, TOTAL, {}, "linear requires num_warmup_steps"),
        ("linear", WARMUP, None, {}, "linear requires num_training_steps"),
        ("cosine_with_min_lr", WARMUP, None, {"min_lr": 0.1}, "cosine_with_min_lr requires num_training_steps"),
        ("constant_with_warmup", None, None, {}, "constant_with_warmup requires num_warmup_steps"),
        ("cosine_with_min_lr", WARMUP, TOTAL, {}, "requires min_lr or min_lr_rate"),
        ("cosine_with_min_lr", WARMUP, TOTAL, {"min_lr": 0.1, "min_lr_rate": 0.1}, "only one of min_lr"),
        ("warmup_stable_decay", WARMUP, TOTAL, {}, "requires num_decay_steps"),
        ("warmup_stable_decay", WARMUP, None, {"num_decay_steps": 3}, "num_training_steps or num_stable_steps"),
        ("warmup_stable_decay", WARMUP, TOTAL, {"num_decay_steps": 3, "decay_type": "exp"}, "unknown decay_type"),
        ("polynomial", WARMUP, TOTAL, {"lr_end": 1.0}, "must be smaller"),
    ],
)
def test_scheduler_argument_errors_name_the_argument(name, warmup, total, kwargs, message):
    with pytest.raises(ValueError, match=message):
        get_scheduler(name, make_optimizer(), warmup, total, kwargs)


def test_unexpected_scheduler_kwarg_is_a_type_error_naming_the_schedule():
    with pytest.raises(TypeError, match=r"linear does not accept .*num_cycles"):
        get_scheduler("linear", make_optimizer(), WARMUP, TOTAL, {"num_cycles": 2})


# --- scheduler state --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=case_id)
def test_scheduler_state_dict_round_trip(case):
    name, kwargs = case

    def make():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # wsd warns when given both num_training_steps and num_stable_steps
            return get_scheduler(name, make_optimizer(), WARMUP, TOTAL, dict(kwargs))

    expected = lrs_over_run(make())
    interrupted, resumed = make(), make()
    before = lrs_over_run(interrupted, steps=7)
    # A checkpoint carries both states; the optimizer's holds the param-group LRs the scheduler last set.
    resumed.optimizer.load_state_dict(copy.deepcopy(interrupted.optimizer.state_dict()))
    resumed.load_state_dict(copy.deepcopy(interrupted.state_dict()))
    after = lrs_over_run(resumed, steps=TOTAL + 3 - 7)
    assert before + after == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_scheduler_pickles():
    scheduler = get_scheduler("cosine_with_min_lr", make_optimizer(), WARMUP, TOTAL, {"min_lr": 0.1})
    lrs_over_run(scheduler, steps=5)
    clone = pickle.loads(pickle.dumps(scheduler))
    assert lrs_over_run(clone, steps=10) == lrs_over_run(scheduler, steps=10)


# --- decay / no-decay parameter groups ----------------------------------------------------------------------


class LlamaRMSNorm(nn.Module):
    """Recognised by class name only: its attribute name `post` matches none of the name patterns."""

    def __init__(self, size):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


class GroupNormConvLayer(nn.Module):
    """A block *containing* a norm: "Norm" mid-name must not exempt its conv weight from decay."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 2, 1, bias=False)
        self.group_norm = nn.GroupNorm(1, 2)


class AdaRMSNorm(nn.Module):
    """A norm with a learned modulation: its own scale is exempt, its Linear child is not."""

    def __init__(self, size):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.modulation = nn.Linear(size, size, bias=False)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.ln = nn.LayerNorm(4)
        self.post = LlamaRMSNorm(4)
        self.conv_block = GroupNormConvLayer()
        self.ada = AdaRMSNorm(4)
        self.frozen = nn.Linear(4, 4, bias=False)
        self.frozen.weight.requires_grad_(False)
        self.final_norm = nn.Module()
        self.final_norm.weight = nn.Parameter(torch.ones(4))  # plain module: exempt by the `_norm` name


def test_decay_parameter_names():
    assert sorted(get_decay_parameter_names(Tiny())) == [
        "ada.modulation.weight",
        "conv_block.conv.weight",
        "embed.weight",
        "frozen.weight",  # listed; create_optimizer leaves it out
        "proj.weight",
    ]


def test_create_optimizer_groups_decay_and_no_decay_trainable_params():
    model = Tiny()
    optimizer = create_optimizer(model, Args(weight_decay=0.1))
    decay, no_decay = optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert sorted(names[id(p)] for p in decay["params"]) == [
        "ada.modulation.weight",
        "conv_block.conv.weight",
        "embed.weight",
        "proj.weight",
    ]
    assert sorted(names[id(p)] for p in no_decay["params"]) == [
        "ada.weight",
        "conv_block.group_norm.bias",
        "conv_block.group_norm.weight",
        "final_norm.weight",
        "ln.bias",
        "ln.weight",
        "post.weight",
        "proj.bias",
    ]


def test_create_optimizer_keeps_an_empty_group_and_rejects_a_frozen_model():
    """transformers keeps both groups, the empty no-decay one too: the optimizer state_dicts of the two
    libraries then have the same groups, so checkpoints cross-resume (test_resume_hf.py)."""
    model = nn.Linear(3, 3, bias=False)
    optimizer = create_optimizer(model, Args(weight_decay=0.1))
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]
    assert [len(group["params"]) for group in optimizer.param_groups] == [1, 0]
    model.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="no parameters with requires_grad"):
        create_optimizer(model, Args())


def test_create_optimizer_honours_optimizer_cls_and_kwargs():
    kwargs = {"lr": 0.3, "momentum": 0.5}
    optimizer = create_optimizer(nn.Linear(2, 2), Args(optim="nope"), (torch.optim.SGD, kwargs))
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["lr"] == 0.3 and optimizer.defaults["momentum"] == 0.5
    assert kwargs == {"lr": 0.3, "momentum": 0.5}  # the caller's dict is not consumed


@pytest.mark.hf
def test_decay_names_match_transformers_on_hf_style_names():
    transformers = pytest.importorskip("transformers")

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(4, 4)
            self.input_layernorm = LlamaRMSNorm(4)
            self.post_attention_layernorm = nn.LayerNorm(4)

    model = nn.Module()
    model.embed_tokens = nn.Embedding(8, 4)
    model.layers = nn.ModuleList([Layer(), Layer()])
    model.norm = LlamaRMSNorm(4)
    model.ln_f = nn.LayerNorm(4)
    model.lm_head = nn.Linear(4, 8, bias=False)
    theirs = transformers.Trainer.get_decay_parameter_names(None, model)  # `self` is unused
    assert sorted(get_decay_parameter_names(model)) == sorted(theirs)


# --- optimizers --------------------------------------------------------------------------------------------


OPTIMIZER_CASES = [
    ("adamw_torch", None, torch.optim.AdamW, {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}),
    ("adamw_torch_fused", None, torch.optim.AdamW, {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "fused": True}),
    ("adafactor", None, Adafactor, {"lr": 1e-3, "scale_parameter": False, "relative_step": False}),
    ("sgd", None, torch.optim.SGD, {"lr": 1e-3}),
    (
        "sgd",
        "momentum=0.9, nesterov=True,dampening=0",
        torch.optim.SGD,
        {"lr": 1e-3, "momentum": 0.9, "nesterov": True, "dampening": 0.0},
    ),
    ("adagrad", "lr_decay=0.1,eps=1e-6", torch.optim.Adagrad, {"lr": 1e-3, "lr_decay": 0.1, "eps": 1e-6}),
    ("rmsprop", None, torch.optim.RMSprop, {"lr": 1e-3}),
    (
        "rmsprop",
        "alpha=0.9,centered=true,momentum=0.5",
        torch.optim.RMSprop,
        {"lr": 1e-3, "alpha": 0.9, "centered": True, "momentum": 0.5},
    ),
]


@pytest.mark.parametrize("name, optim_args, cls, kwargs", OPTIMIZER_CASES)
def test_optimizer_class_kwargs_and_built_hyperparameters(name, optim_args, cls, kwargs):
    model = nn.Linear(3, 2)
    args = Args(optim=name, optim_args=optim_args, weight_decay=0.01)
    assert get_optimizer_cls_and_kwargs(args, model) == (cls, kwargs)
    optimizer = create_optimizer(model, args)
    assert type(optimizer) is cls
    for key, value in kwargs.items():
        assert optimizer.param_groups[0][key] == value
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.01, 0.0]


@pytest.mark.hf
@pytest.mark.parametrize("name, optim_args, cls, kwargs", OPTIMIZER_CASES)
def test_optimizer_kwargs_match_transformers(name, optim_args, cls, kwargs):
    transformers = pytest.importorskip("transformers")
    args = Args(optim=name, optim_args=optim_args)
    their_cls, their_kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args)
    our_cls, our_kwargs = get_optimizer_cls_and_kwargs(args)
    assert our_cls.__name__ == their_cls.__name__
    assert our_kwargs == their_kwargs


def test_adamw_uses_torchs_default_kernel_choice():
    optimizer = create_optimizer(nn.Linear(2, 2), Args(optim="adamw_torch"))
    assert optimizer.defaults["foreach"] is None and not optimizer.defaults["fused"]


def test_adamw_fused_steps_on_cpu_and_falls_back_where_unsupported():
    model = nn.Linear(3, 2)
    optimizer = create_optimizer(model, Args(optim="adamw_torch_fused"))
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()  # torch >= 2.4 has a fused CPU kernel
    meta_model = nn.Linear(3, 2, device="meta")  # "meta" has no fused kernel
    with pytest.warns(UserWarning, match="fused AdamW does not support"):
        _, kwargs = get_optimizer_cls_and_kwargs(Args(optim="adamw_torch_fused"), meta_model)
    assert "fused" not in kwargs


def test_optimizer_name_may_be_a_str_enum():
    class OptimizerNames(str, enum.Enum):
        SGD = "sgd"

    assert get_optimizer_cls_and_kwargs(Args(optim=OptimizerNames.SGD))[0] is torch.optim.SGD


def test_unknown_optimizer_names_optim_the_value_and_the_choices():
    with pytest.raises(ValueError, match="optim='adamw_apex_fused'") as error:
        get_optimizer_cls_and_kwargs(Args(optim="adamw_apex_fused"))
    for name in OPTIMIZER_NAMES:
        assert name in str(error.value)


def test_parse_optim_args():
    assert parse_optim_args(None) == {} and parse_optim_args("") == {}
    assert parse_optim_args(" momentum = 0.9 ,nesterov=True,") == {"momentum": "0.9", "nesterov": "True"}
    with pytest.raises(ValueError, match="key=value"):
        parse_optim_args("momentum")


def test_unused_optim_args_warn():
    with pytest.warns(UserWarning, match="'betas'"):
        get_optimizer_cls_and_kwargs(Args(optim="sgd", optim_args="betas=0.1"))
    with pytest.warns(UserWarning, match="ignores optim_args"):
        get_optimizer_cls_and_kwargs(Args(optim="adamw_torch", optim_args="amsgrad=True"))


# --- Adafactor -----------------------------------------------------------------------------------------------


def make_adafactor_problem(dtype=torch.float32):
    """Parameters of every kind Adafactor treats differently: a 3-D and a 2-D (factored) and a vector."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(2, 3, 4), (4, 5), (5,)]
    return [nn.Parameter(torch.randn(shape, generator=generator).to(dtype)) for shape in shapes]


def adafactor_loss(params):
    cube, matrix, vector = (p.float() for p in params)
    return ((cube.sum(0) @ matrix - 1.0) ** 2).mean() + (vector**2).sum() + (cube**4).mean()


def run_adafactor(optimizer_cls, params, steps, **settings):
    optimizer = optimizer_cls(params, **settings)
    for _ in range(steps):
        optimizer.zero_grad()
        adafactor_loss(params).backward()
        optimizer.step()
    return optimizer


ADAFACTOR_SETTINGS = [
    {"lr": 1e-2, "scale_parameter": False, "relative_step": False},  # what optim="adafactor" passes
    {},  # relative step, parameter scaling
    {"warmup_init": True, "beta1": 0.9, "weight_decay": 0.1, "clip_threshold": 0.5, "decay_rate": -0.5},
    {"lr": 3e-2, "scale_parameter": True, "relative_step": False, "beta1": 0.8, "eps": (1e-20, 1e-2)},
]


@pytest.mark.hf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("settings", ADAFACTOR_SETTINGS)
def test_adafactor_matches_transformers(settings, dtype):
    hf_optimization = pytest.importorskip("transformers.optimization")
    ours, theirs = make_adafactor_problem(dtype), make_adafactor_problem(dtype)
    run_adafactor(Adafactor, ours, 6, **settings)
    run_adafactor(hf_optimization.Adafactor, theirs, 6, **settings)
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("settings", ADAFACTOR_SETTINGS[:2])
def test_adafactor_reduces_the_loss(settings):
    params = make_adafactor_problem()
    start = adafactor_loss(params).item()
    run_adafactor(Adafactor, params, 40, **settings)
    assert adafactor_loss(params).item() < 0.5 * start


def test_adafactor_factors_second_moments_of_matrices_only():
    params = make_adafactor_problem()
    optimizer = run_adafactor(Adafactor, params, 1)
    cube, matrix, vector = (optimizer.state[p] for p in params)
    assert cube["exp_avg_sq_row"].shape == (2, 3) and cube["exp_avg_sq_col"].shape == (2, 4)
    assert matrix["exp_avg_sq_row"].shape == (4,) and matrix["exp_avg_sq_col"].shape == (5,)
    assert vector["exp_avg_sq"].shape == (5,) and "exp_avg_sq_row" not in vector


def test_adafactor_resumes_from_state_dict():
    settings = {"lr": 1e-2, "scale_parameter": False, "relative_step": False, "beta1": 0.9}
    uninterrupted = make_adafactor_problem()
    run_adafactor(Adafactor, uninterrupted, 6, **settings)

    first_half = make_adafactor_problem()
    saved = copy.deepcopy(run_adafactor(Adafactor, first_half, 3, **settings).state_dict())
    resumed = [nn.Parameter(p.detach().clone()) for p in first_half]
    optimizer = Adafactor(resumed, **settings)
    optimizer.load_state_dict(saved)
    for _ in range(3):
        optimizer.zero_grad()
        adafactor_loss(resumed).backward()
        optimizer.step()
    for a, b in zip(resumed, uninterrupted):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_adafactor_rejects_contradictory_options():
    params = make_adafactor_problem()
    with pytest.raises(ValueError, match="relative_step=True"):
        Adafactor(params, lr=1e-3)
    with pytest.raises(ValueError, match="needs an lr"):
        Adafactor(params, relative_step=False)
    with pytest.raises(ValueError, match="warmup_init"):
        Adafactor(params, lr=1e-3, relative_step=False, warmup_init=True)
