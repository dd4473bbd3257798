"""Trainer.accelerator (issue 38): the accelerate surface libraries built on the Trainer call (TRL,
sentence-transformers, setfit), on lathe's runtime. Each call is compared with accelerate's own Accelerator
(installed with the test extra) on the same input, in one process; gather / reduce / pad / gather_for_metrics
/ split_between_processes on 2 gloo processes (accelerator_worker.py) against what accelerate documents and
returns there."""

from __future__ import annotations

import json

import pytest
import torch

from lathe.train.accelerator import DistributedType, Unsupported
from tests.train.torchrun_helpers import launch
from tests.train.trainer_helpers import Regression, make_trainer, regression_items, training_args

accelerate = pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """lathe's trainer.accelerator and accelerate's Accelerator as transformers' Trainer builds it (cpu)."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, GradientAccumulationPlugin

    args = training_args(tmp_path_factory.mktemp("acc"), use_cpu=True)
    trainer = make_trainer("lathe", model=Regression(), args=args, train_dataset=regression_items(8))
    theirs = Accelerator(
        cpu=True,
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),  # transformers' defaults
    )
    return trainer, trainer.accelerator, theirs


NESTED = {"a": torch.arange(6.0).reshape(2, 3), "b": [torch.tensor(2.5), (torch.ones(1, 2),)]}


def assert_same(ours, theirs):
    assert type(ours) is type(theirs)
    if torch.is_tensor(theirs):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    elif isinstance(theirs, dict):
        assert ours.keys() == theirs.keys()
        for key in theirs:
            assert_same(ours[key], theirs[key])
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs)
        for mine, other in zip(ours, theirs):
            assert_same(mine, other)
    else:
        assert ours == theirs


def test_where_this_process_stands_as_accelerate_says(both):
    _, ours, theirs = both
    for name in (
        "is_main_process",
        "is_local_main_process",
        "is_last_process",
        "process_index",
        "local_process_index",
        "num_processes",
        "device",
        "mixed_precision",
        "use_distributed",
        "gradient_accumulation_steps",
        "sync_gradients",
        "distributed_type",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.distributed_type == accelerate.utils.DistributedType.NO  # lathe's enum compares equal to accelerate's
    for name in ("num_processes", "process_index", "device", "distributed_type", "is_main_process"):
        assert getattr(ours.state, name) == getattr(theirs.state, name), name
    assert ours.state.deepspeed_plugin is None and theirs.state.deepspeed_plugin is None
    assert getattr(ours.state, "fsdp_plugin", None) is None and getattr(theirs.state, "fsdp_plugin", None) is None


def test_collectives_in_one_process_give_accelerates_results(both):
    _, ours, theirs = both
    assert_same(ours.gather(NESTED), theirs.gather(NESTED))
    assert_same(ours.gather_for_metrics(NESTED), theirs.gather_for_metrics(NESTED))
    assert ours.gather_for_metrics(["x", "y"]) == theirs.gather_for_metrics(["x", "y"]) == ["x", "y"]
    assert_same(ours.pad_across_processes(NESTED, dim=1), theirs.pad_across_processes(NESTED, dim=1))
    for reduction in ("sum", "mean", "max"):
        mine, other = ours.reduce(NESTED, reduction=reduction), theirs.reduce(NESTED, reduction=reduction)
        assert_same(mine, other)
        assert mine["a"] is not NESTED["a"]  # a copy, as accelerate returns
    with ours.split_between_processes([1, 2, 3]) as mine, theirs.split_between_processes([1, 2, 3]) as other:
        assert mine == other == [1, 2, 3]
    with pytest.raises(TypeError, match="reduce"):
        ours.reduce({"a": "text"})


def test_model_helpers_give_accelerates_results(both):
    trainer, ours, theirs = both
    ddp_like = torch.nn.DataParallel(trainer.model)
    assert ours.unwrap_model(ddp_like) is theirs.unwrap_model(ddp_like) is trainer.model
    compiled = torch.compile(trainer.model)
    assert ours.unwrap_model(compiled) is theirs.unwrap_model(compiled) is compiled
    assert ours.unwrap_model(compiled, keep_torch_compile=False) is trainer.model
    assert_same(ours.get_state_dict(trainer.model), theirs.get_state_dict(trainer.model))
    other = Regression()
    assert ours.prepare_model(other, evaluation_mode=True) is other  # already on the (cpu) device
    assert ours.prepare(trainer.model) is trainer.model_wrapped
    model, number = ours.prepare(other, 3)
    assert model is other and number == 3  # accelerate returns objects it does not know unchanged
    assert ours.free_memory(1, 2) == theirs.free_memory(1, 2) == [None, None]


def test_backward_autocast_accumulate_and_save(both, tmp_path):
    trainer, ours, theirs = both
    weights = torch.ones(3, requires_grad=True)
    ours.backward((weights * 2).sum())
    lathe_grad = weights.grad.clone()
    weights.grad = None
    theirs.backward((weights * 2).sum())
    torch.testing.assert_close(lathe_grad, weights.grad, rtol=0, atol=0)
    with ours.autocast(), theirs.autocast():
        assert torch.is_autocast_enabled("cpu") is False  # fp32 run: no autocast on either side
    with ours.accumulate(trainer.model):
        assert ours.sync_gradients is True  # gradient_accumulation_steps 1: every step syncs, as accelerate
    with ours.no_sync(trainer.model), ours.main_process_first(), ours.local_main_process_first():
        ours.wait_for_everyone()
    ours.save({"w": weights.detach()}, tmp_path / "ours.bin")
    theirs.save({"w": weights.detach()}, tmp_path / "theirs.bin")
    assert_same(torch.load(tmp_path / "ours.bin"), torch.load(tmp_path / "theirs.bin"))
    ours.save({"w": weights.detach()}, tmp_path / "ours.safetensors", safe_serialization=True)
    from safetensors.torch import load_file

    torch.testing.assert_close(load_file(tmp_path / "ours.safetensors")["w"], weights.detach())


def test_sync_gradients_follows_the_accumulation_window(tmp_path):
    from lathe import TrainerCallback

    seen = []

    class Record(TrainerCallback):
        def on_substep_end(self, args, state, control, **kwargs):
            seen.append(trainer.accelerator.sync_gradients)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            seen.append(trainer.accelerator.sync_gradients)

    args = training_args(tmp_path, max_steps=2, gradient_accumulation_steps=2)
    trainer = make_trainer("lathe", model=Regression(), args=args, train_dataset=regression_items(8))
    trainer.add_callback(Record())
    trainer.accelerator  # noqa: B018  (asked for before train, as a library's __init__ does)
    trainer.train()
    assert seen == [False, True, False, True]


def test_what_lathe_cannot_honour_raises_naming_it(tmp_path):
    args = training_args(tmp_path)
    trainer = make_trainer("lathe", model=Regression(), args=args, train_dataset=regression_items(8))
    with pytest.raises(Unsupported, match="accelerator.register_for_checkpointing"):
        trainer.accelerator.register_for_checkpointing(object())
    with pytest.raises(Unsupported, match="autocast_handler"):
        trainer.accelerator.autocast(autocast_handler=object())
    assert trainer.accelerator.distributed_type is DistributedType.NO
    assert not hasattr(trainer.accelerator, "register_for_checkpointing")  # libraries probing for a feature


@pytest.mark.slow
def test_collectives_on_two_processes(tmp_path):
    """gather / gather_for_metrics / pad / reduce / split across 2 gloo ranks, as accelerate gives them there."""
    from tests.train.torchrun_helpers import REPOSITORY

    worker = REPOSITORY / "tests" / "train" / "accelerator_worker.py"
    completed = launch(tmp_path, "acc", {}, worker=worker)
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads((tmp_path / "acc.json").read_text())
    assert result["gather"] == [0.0, 1.0, 10.0, 11.0]  # rank order, dim 0
    assert result["gather_scalar"] == [0.0, 1.0]  # 0-d tensors become 1-d
    assert result["objects"] == ["r0", "r1a", "r1b"]  # gather_object concatenates every rank's list
    assert result["pad"] == [[0.0, -1.0], [1.0, 1.0]]  # rank 0 padded at the end to rank 1's length
    assert result["pad_first"] == [-1.0, -1.0, 0.0]
    assert result["reduce_sum"] == 3.0 and result["reduce_mean"] == 1.5 and result["reduce_max"] == 2.0
    assert result["split"] == [[0, 1, 2], [3, 4]] and result["split_padded"] == [[0, 1, 2], [3, 4, 4]]
    assert result["info"] == [[0, 2, "MULTI_CPU", True], [1, 2, "MULTI_CPU", False]]


def test_prepare_a_shuffled_dataloader_gives_accelerates_epoch_orders(both):
    """A library's own shuffled DataLoader (sentence-transformers builds one) comes back with accelerate's
    seedable sampler: each pass is seeded with the initial seed + epoch, so epochs 1, 2, ... match transformers'."""
    from torch.utils.data import DataLoader

    _, ours, theirs = both

    def loader():
        return DataLoader(list(range(10)), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(7))

    torch.manual_seed(42)  # the initial seed the sampler reads, as Trainer's set_seed leaves it
    mine, other = ours.prepare(loader()), theirs.prepare(loader())
    for _ in range(3):
        assert [batch.tolist() for batch in mine] == [batch.tolist() for batch in other]
