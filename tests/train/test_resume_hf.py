"""Checkpoints cross between lathe and transformers.Trainer both ways: lathe resumes a checkpoint-k
written by transformers and ends bitwise equal to transformers' uninterrupted run, and transformers
resumes one written by lathe and ends bitwise equal to lathe's. The two libraries' uninterrupted
runs are themselves bit-identical here (shuffled sampler, AdamW, linear warmup, clipping), and so
are the checkpoints' trainer_state.json and model.safetensors."""

from __future__ import annotations

import importlib
import json
import os

import pytest
import torch
from torch import nn

from lathe.train.checkpoints import layout as ckpt
from lathe.train.checkpoints import loading
from tests.train.trainer_helpers import assert_same_weights, pad_collate, tiny_llama, token_items

pytestmark = pytest.mark.hf

LATHE_ONLY_FILES = {ckpt.MANIFEST_NAME, ckpt.TRAINING_ARGS_JSON}


class MLP(nn.Module):
    """A small regression MLP; dropout > 0 makes the global RNG matter."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.hidden = nn.Linear(4, 16)
        self.head = nn.Linear(16, 1)
        self.dropout = dropout

    def forward(self, x, labels=None):
        hidden = nn.functional.dropout(torch.relu(self.hidden(x)), self.dropout, self.training)
        prediction = self.head(hidden).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def regression_items(count: int = 10) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(count, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(count, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(count)]


def run(library: str, output_dir, resume=None, model=None, dataset=None, collator=None, **overrides):
    module = importlib.import_module(library)
    options = dict(
        output_dir=str(output_dir),
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        per_device_train_batch_size=2,
        num_train_epochs=3,
        learning_rate=0.01,
        warmup_steps=2,
        weight_decay=0.01,
        save_steps=4,
        seed=0,
        dataloader_pin_memory=False,
    )
    options.update(overrides)
    trainer = module.Trainer(
        model=model if model is not None else MLP(),
        args=module.TrainingArguments(**options),
        train_dataset=dataset if dataset is not None else regression_items(),
        data_collator=collator,
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def step_logs(trainer, after_step: int) -> list[dict]:
    """Step logs after the resume point, without timings (the train summary left out)."""
    return [
        {key: value for key, value in entry.items() if "runtime" not in key and "per_second" not in key}
        for entry in trainer.state.log_history
        if entry["step"] > after_step and "train_loss" not in entry
    ]


CASES = {
    "mid-epoch": dict(save_steps=4),  # epoch 0 after 4 of its 5 batches
    "epoch boundary": dict(save_steps=5),
    "short accumulation window": dict(save_steps=3, gradient_accumulation_steps=3),  # windows 3 + 2
    "max_steps, cosine": dict(save_steps=7, max_steps=12, lr_scheduler_type="cosine"),
}


@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["no dropout", "dropout"])
@pytest.mark.parametrize("case", list(CASES))
def test_checkpoints_resume_across_libraries_bitwise(tmp_path, case, dropout):
    options = CASES[case]
    step = options["save_steps"]
    theirs = run("transformers", tmp_path / "transformers", model=MLP(dropout), **options)
    ours = run("lathe", tmp_path / "lathe", model=MLP(dropout), **options)
    assert_same_weights(theirs.model, ours.model)  # the uninterrupted runs agree to start with
    their_checkpoint = tmp_path / "transformers" / f"checkpoint-{step}"
    our_checkpoint = tmp_path / "lathe" / f"checkpoint-{step}"
    # Same trainer_state.json byte for byte (same keys, sorted, indent 2), same weights file.
    assert (their_checkpoint / ckpt.TRAINER_STATE_NAME).read_bytes() == (
        our_checkpoint / ckpt.TRAINER_STATE_NAME
    ).read_bytes()
    assert (their_checkpoint / ckpt.WEIGHTS_NAME).read_bytes() == (our_checkpoint / ckpt.WEIGHTS_NAME).read_bytes()

    lathe_from_theirs = run(
        "lathe", tmp_path / "lathe-resumed", resume=str(their_checkpoint), model=MLP(dropout), **options
    )
    assert_same_weights(theirs.model, lathe_from_theirs.model)
    assert step_logs(lathe_from_theirs, step) == step_logs(theirs, step)
    assert lathe_from_theirs.state.log_history[:step] == theirs.state.log_history[:step]

    theirs_from_ours = run(
        "transformers", tmp_path / "transformers-resumed", resume=str(our_checkpoint), model=MLP(dropout), **options
    )
    assert_same_weights(ours.model, theirs_from_ours.model)
    assert step_logs(theirs_from_ours, step) == step_logs(ours, step)


def test_checkpoint_files_match_transformers(tmp_path):
    run("transformers", tmp_path / "transformers", max_steps=4)
    run("lathe", tmp_path / "lathe", max_steps=4)
    theirs, ours = tmp_path / "transformers" / "checkpoint-4", tmp_path / "lathe" / "checkpoint-4"
    assert set(os.listdir(ours)) - LATHE_ONLY_FILES == set(os.listdir(theirs))
    assert (
        loading.safe_torch_load(str(ours / "rng_state.pth")).keys()
        == loading.safe_torch_load(str(theirs / "rng_state.pth")).keys()
    )
    their_optimizer = torch.load(theirs / "optimizer.pt", weights_only=True)
    our_optimizer = torch.load(ours / "optimizer.pt", weights_only=True)
    assert our_optimizer["param_groups"] == their_optimizer["param_groups"]  # decay / no-decay groups, hyperparameters
    assert our_optimizer["state"].keys() == their_optimizer["state"].keys()
    for index, state in our_optimizer["state"].items():
        assert state.keys() == their_optimizer["state"][index].keys()
        assert all(torch.equal(state[key], their_optimizer["state"][index][key]) for key in state)
    assert torch.load(ours / "scheduler.pt", weights_only=True) == torch.load(
        theirs / "scheduler.pt", weights_only=True
    )
    assert json.loads((ours / ckpt.TRAINER_STATE_NAME).read_text()) == json.loads(
        (theirs / ckpt.TRAINER_STATE_NAME).read_text()
    )


class BiasFree(nn.Module):
    """No bias and no norm: every parameter decays, so the no-decay group is empty."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.hidden = nn.Linear(4, 16, bias=False)
        self.head = nn.Linear(16, 1, bias=False)

    def forward(self, x, labels=None):
        prediction = self.head(torch.relu(self.hidden(x))).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def test_a_model_without_bias_or_norm_cross_resumes_both_ways(tmp_path):
    """Both libraries keep the empty no-decay group, so the optimizer state loads either way
    (without it: "loaded state dict has a different number of parameter groups")."""
    options = dict(save_steps=4)
    theirs = run("transformers", tmp_path / "transformers", model=BiasFree(), **options)
    ours = run("lathe", tmp_path / "lathe", model=BiasFree(), **options)
    assert_same_weights(theirs.model, ours.model)
    groups = torch.load(tmp_path / "lathe" / "checkpoint-4" / "optimizer.pt", weights_only=True)["param_groups"]
    assert [len(group["params"]) for group in groups] == [2, 0]
    lathe_from_theirs = run(
        "lathe", tmp_path / "lathe-resumed", resume=str(tmp_path / "transformers" / "checkpoint-4"), model=BiasFree()
    )
    assert_same_weights(theirs.model, lathe_from_theirs.model)
    theirs_from_ours = run(
        "transformers", tmp_path / "hf-resumed", resume=str(tmp_path / "lathe" / "checkpoint-4"), model=BiasFree()
    )
    assert_same_weights(ours.model, theirs_from_ours.model)
    assert step_logs(theirs_from_ours, 4) == step_logs(ours, 4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "config", [{}, {"attention_dropout": 0.2, "tie_word_embeddings": True}], ids=["plain", "dropout, tied"]
)
def test_causal_lm_checkpoints_resume_across_libraries_bitwise(tmp_path, config):
    """save_pretrained layout (config.json, generation_config.json), padded variable-length batches,
    accumulation 2 (the loss is divided by num_items_in_batch), tokens seen and FLOs counted."""
    options = dict(
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        include_num_input_tokens_seen="non_padding",
        dataset=token_items(),
        collator=pad_collate,
    )
    theirs = run("transformers", tmp_path / "transformers", model=tiny_llama(**config), **options)
    ours = run("lathe", tmp_path / "lathe", model=tiny_llama(**config), **options)
    assert_same_weights(theirs.model, ours.model)
    for field in ("total_flos", "num_input_tokens_seen", "epoch", "global_step"):
        assert getattr(ours.state, field) == getattr(theirs.state, field), field
    their_checkpoint, our_checkpoint = tmp_path / "transformers" / "checkpoint-4", tmp_path / "lathe" / "checkpoint-4"
    assert {"config.json", "generation_config.json", "model.safetensors"} <= set(os.listdir(our_checkpoint))
    assert set(os.listdir(our_checkpoint)) - LATHE_ONLY_FILES == set(os.listdir(their_checkpoint))

    lathe_from_theirs = run(
        "lathe", tmp_path / "lathe-resumed", resume=str(their_checkpoint), model=tiny_llama(**config), **options
    )
    assert_same_weights(theirs.model, lathe_from_theirs.model)
    assert step_logs(lathe_from_theirs, 4) == step_logs(theirs, 4)
    theirs_from_ours = run(
        "transformers",
        tmp_path / "transformers-resumed",
        resume=str(our_checkpoint),
        model=tiny_llama(**config),
        **options,
    )
    assert_same_weights(ours.model, theirs_from_ours.model)
    assert step_logs(theirs_from_ours, 4) == step_logs(ours, 4)
    for resumed in (lathe_from_theirs, theirs_from_ours):
        assert resumed.state.total_flos == theirs.state.total_flos
        assert resumed.state.num_input_tokens_seen == theirs.state.num_input_tokens_seen
        # the step logs carry the same keys in both libraries, timings included
        assert [set(entry) for entry in resumed.state.log_history] == [set(entry) for entry in theirs.state.log_history]
