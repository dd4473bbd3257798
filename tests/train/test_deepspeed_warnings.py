"""torch 2.13 deprecates the collectives DeepSpeed calls (a FutureWarning per call site, per rank, again
whenever something resets the warning registry): lathe silences exactly those, only while it is calling
into the engine; a FutureWarning of the user's own code during training still shows."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")


@pytest.fixture(autouse=True, scope="module")
def one_process_afterwards():
    """DeepSpeed in this process starts a process group and sets RANK, WORLD_SIZE, ...: undo both once this
    module is done (DeepSpeed keeps the group for its next engine), or later tests, and transformers' Trainer
    in them, would believe they run distributed. ZeRO-3's Init also replaces torch.nn.functional.linear for the
    rest of the process ("This will persist unless manually reset"): its autograd function saves other tensors
    than F.linear under autocast, which a memory test run later in this process measures."""
    import os

    import torch.distributed as dist
    import torch.nn.functional

    environment = dict(os.environ)
    was_initialized = dist.is_available() and dist.is_initialized()
    linear = torch.nn.functional.linear
    yield
    torch.nn.functional.linear = linear
    if dist.is_available() and dist.is_initialized() and not was_initialized:
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(environment)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_training_shows_no_deprecated_collective_warnings(tmp_path, stage):
    from lathe import Trainer, TrainingArguments
    from lathe.train.callbacks.events import TrainerCallback
    from tests.train.deepspeed_worker import TokenModel, accuracy, dataset, zero_config

    silenced_between_calls = []

    class UserWarns(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            # Between lathe's calls into the engine, no filter of lathe's is in place.
            silenced_between_calls.append(
                any(f[1] is not None and "distributed" in f[1].pattern for f in warnings.filters)
            )
            if state.global_step == 2:
                warnings.warn("the user's own FutureWarning", FutureWarning)

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=2,
        num_train_epochs=1,
        learning_rate=0.1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        dataloader_pin_memory=False,
        save_strategy="no",
        deepspeed=zero_config(stage),
    )
    trainer = Trainer(
        model=TokenModel(),
        args=args,
        train_dataset=dataset(32),
        eval_dataset=dataset(13),
        compute_metrics=accuracy,
        callbacks=[UserWarns()],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every call, as a reset registry (or a second rank) would show them
        trainer.train()
        trainer.evaluate()
    messages = [str(item.message) for item in caught if issubclass(item.category, FutureWarning)]
    assert trainer.state.global_step == 8
    assert not [m for m in messages if "torch.distributed" in m], messages
    assert messages.count("the user's own FutureWarning") == 1
    assert silenced_between_calls == [False] * 8
