"""TrainingArguments' Hub, debug, accelerate, kernel, JIT-checkpoint and tracker fields: transformers'
names and defaults, what each does in lathe, and a clear error at TrainingArguments() for what cannot run."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import pytest
import torch

from lathe import Trainer, TrainerCallback, TrainingArguments
from lathe.train.args.training_args import AcceleratorConfig, DebugOption, HubStrategy, ParallelMode
from tests.train.trainer_helpers import Regression, regression_items, training_args

# Fields another branch adds (issue 15: the optimizers' target modules); the lead drops this after merging.
PENDING_FIELDS: set[str] = set()  # fields another branch adds: none now


@pytest.mark.hf
def test_every_transformers_field_exists_with_its_default():
    transformers = pytest.importorskip("transformers")
    import lathe

    for theirs in (transformers.TrainingArguments, transformers.Seq2SeqTrainingArguments):
        ours = getattr(lathe, theirs.__name__)
        mine = {f.name: f for f in dataclasses.fields(ours)}
        missing = sorted({f.name for f in dataclasses.fields(theirs)} - set(mine) - PENDING_FIELDS)
        assert missing == [], theirs.__name__
    defaults = transformers.TrainingArguments(output_dir="o", report_to="none").to_dict()
    ours = TrainingArguments(output_dir="o").to_dict()
    new = ["hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push", "hub_revision"]
    new += ["debug", "accelerator_config", "use_liger_kernel", "liger_kernel_config", "enable_jit_checkpoint"]
    new += ["project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id"]
    for name in new:
        assert ours[name] == defaults[name], name


def test_hub_strategy_and_debug_are_converted():
    args = TrainingArguments(output_dir="o", hub_strategy="end", debug="underflow_overflow")
    assert args.hub_strategy is HubStrategy.END and args.debug == [DebugOption.UNDERFLOW_OVERFLOW]
    assert TrainingArguments(output_dir="o", debug=None).debug == []
    assert TrainingArguments(output_dir="o").debug == []
    with pytest.raises(ValueError, match="hub_strategy='sometimes'"):
        TrainingArguments(output_dir="o", hub_strategy="sometimes")
    with pytest.raises(ValueError, match="debug='overflow'"):
        TrainingArguments(output_dir="o", debug="overflow")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(push_to_hub=True), "offline"),
        (dict(debug="tpu_metrics_debug"), "TPU"),
        (dict(parallelism_config=object()), "parallelism_config"),
        (dict(trackio_space_id="me/space"), "trackio_space_id"),
        (dict(trackio_bucket_id="bucket"), "trackio_bucket_id"),
        (dict(accelerator_config={"use_seedable_sampler": False}), "use_seedable_sampler"),
        (dict(accelerator_config={"split_batche": True}), "unknown keys"),
        (
            dict(accelerator_config={"gradient_accumulation_kwargs": {"num_steps": 2}}, gradient_accumulation_steps=4),
            "set only one",
        ),
        (dict(accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}), "only num_steps"),
        (dict(liger_kernel_config={"rope": "yes"}), "liger_kernel_config"),
        (dict(project=""), "project"),
    ],
)
def test_what_cannot_run_here_is_an_error_at_construction(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TrainingArguments(output_dir="o", **kwargs)
    with pytest.raises(ValueError, match="offline"):
        TrainingArguments(output_dir="o").set_push_to_hub("me/model")


def test_accelerator_config_from_json_dict_or_file(tmp_path, monkeypatch):
    args = TrainingArguments(
        output_dir="o", accelerator_config='{"split_batches": "True", "gradient_accumulation_kwargs": {"num_steps": 2}}'
    )
    assert isinstance(args.accelerator_config, AcceleratorConfig)
    assert args.accelerator_config.split_batches is True and args.gradient_accumulation_steps == 2
    path = tmp_path / "accelerator.json"
    path.write_text(json.dumps({"even_batches": True, "dispatch_batches": False}))
    assert TrainingArguments(output_dir="o", accelerator_config=str(path)).accelerator_config.dispatch_batches is False
    rebuilt = TrainingArguments(**{k: v for k, v in args.to_dict().items() if k != "hub_token"})
    assert rebuilt == args  # to_dict -> TrainingArguments keeps the same arguments
    assert "use_configured_state" not in args.to_dict()["accelerator_config"]
    # with several processes, how accelerate splits batches between them is not lathe's loop
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="split_batches"):
        TrainingArguments(output_dir="o", accelerator_config={"split_batches": True})


def test_accumulation_from_accelerator_config_trains_like_gradient_accumulation_steps(tmp_path):
    finals = []
    for extra in (
        dict(gradient_accumulation_steps=2),
        dict(accelerator_config={"gradient_accumulation_kwargs": {"num_steps": 2}}),
    ):
        model = Regression()
        args = training_args(tmp_path / str(len(finals)), max_steps=3, **extra)
        Trainer(model=model, args=args, train_dataset=regression_items(12)).train()
        finals.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(finals[0], finals[1])


def test_derived_attributes_describe_a_single_process_run():
    args = TrainingArguments(output_dir="o", bf16=True, use_cpu=True)
    assert args.parallel_mode is ParallelMode.NOT_PARALLEL and args.place_model_on_device is True
    assert args.mixed_precision == "bf16" and args.default_optim == "adamw_torch_fused"
    assert args.fsdp_plugin_args is None and args.distributed_state.distributed_type == "NO"


class Exploding(torch.nn.Module):
    """A linear layer followed by a layer that multiplies by a huge number from the second batch on."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(3, 3)
        self.second = torch.nn.Linear(3, 1)
        self.calls = 0

    def forward(self, x, labels=None):
        self.calls += 1
        hidden = self.first(x) * (1e39 if self.calls >= 2 else 1.0)
        prediction = self.second(hidden).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean()}


def test_debug_underflow_overflow_stops_at_the_first_inf_and_prints_the_frames(tmp_path, capsys):
    args = training_args(tmp_path, max_steps=5, debug="underflow_overflow")
    model = Exploding()
    with pytest.raises(ValueError, match="DebugUnderflowOverflow: inf/nan detected"):
        Trainer(model=model, args=args, train_dataset=regression_items(12)).train()
    printed = capsys.readouterr().out
    assert "Detected inf/nan during batch_number=1" in printed
    assert "first Linear" in printed and "inf" in printed
    assert model.calls == 2  # stopped in the batch where it happened


class SigtermAtStep2(TrainerCallback):
    """Sends SIGTERM at step 2's end, then holds step 3's start until the grace period has passed."""

    def __init__(self):
        self.manager = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_step_begin(self, args, state, control, **kwargs):
        deadline = time.monotonic() + 10
        while state.global_step == 2 and not self.manager.is_checkpoint_requested and time.monotonic() < deadline:
            time.sleep(0.01)


def test_enable_jit_checkpoint_saves_and_stops_after_the_grace_period(tmp_path):
    """transformers' JIT checkpoint: the handler is set when the Trainer is made; SIGTERM arms a timer of
    kill_wait seconds; the next step hook (here step 3's pre-optimizer hook) saves checkpoint-2 and stops
    after that step. Resuming from it ends where an uninterrupted run ends."""
    from lathe.trainer_jit_checkpoint import JITCheckpointCallback

    previous = signal.getsignal(signal.SIGTERM)
    sender = SigtermAtStep2()
    args = training_args(tmp_path / "jit", max_steps=6, enable_jit_checkpoint=True)
    trainer = Trainer(model=Regression(), args=args, train_dataset=regression_items(20), callbacks=[sender])
    (jit,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, JITCheckpointCallback)]
    assert jit.trainer is trainer and signal.getsignal(signal.SIGTERM) == jit.jit_manager._sigterm_handler
    assert jit.jit_manager.kill_wait == 3  # transformers' grace period
    jit.jit_manager.kill_wait, sender.manager = 0.2, jit.jit_manager
    trainer.train()
    assert trainer.state.global_step == 3
    assert sorted(os.listdir(tmp_path / "jit")) == ["checkpoint-2"]  # no sentinel file, no step-end save
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is restored after training

    resumed = Trainer(
        model=Regression(), args=training_args(tmp_path / "jit", max_steps=6), train_dataset=regression_items(20)
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "jit" / "checkpoint-2"))
    straight = Trainer(
        model=Regression(), args=training_args(tmp_path / "straight", max_steps=6), train_dataset=regression_items(20)
    )
    straight.train()
    for ours, reference in zip(resumed.model.parameters(), straight.model.parameters()):
        assert torch.equal(ours, reference)


def test_without_enable_jit_checkpoint_sigterm_is_left_alone(tmp_path):
    from lathe.trainer_jit_checkpoint import JITCheckpointCallback

    previous = signal.getsignal(signal.SIGTERM)
    trainer = Trainer(model=Regression(), args=training_args(tmp_path), train_dataset=regression_items(4))
    assert not any(isinstance(c, JITCheckpointCallback) for c in trainer.callback_handler.callbacks)
    assert signal.getsignal(signal.SIGTERM) == previous
