"""Arguments lathe used to accept and ignore (issue 17, point 7), each doing what transformers does or refused:
neftune_noise_alpha, tf32, fp16/bf16_full_eval, torch_empty_cache_steps, skip_memory_metrics, past_index,
Seq2SeqTrainingArguments.generation_config (test_trainer_methods.py). Compared with transformers (`hf`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.train.trainer_helpers import (
    Regression,
    library_module,
    make_trainer,
    pad_collate,
    regression_items,
    tiny_llama,
    token_items,
    training_args,
)

BOTH = ["lathe", pytest.param("transformers", marks=pytest.mark.hf)]


def llama_losses(library, output_dir, **overrides):
    args = training_args(output_dir, library, max_steps=3, **overrides)
    trainer = make_trainer(
        library, model=tiny_llama(), args=args, train_dataset=token_items(6), data_collator=pad_collate
    )
    trainer.train()
    return trainer, [log["loss"] for log in trainer.state.log_history if "loss" in log]


@pytest.mark.parametrize("library", BOTH)
def test_neftune_noise_during_training_only(tmp_path, library):
    plain = llama_losses(library, tmp_path / "plain")[1]
    trainer, noisy = llama_losses(library, tmp_path / "noisy", neftune_noise_alpha=5.0)
    assert noisy[0] != plain[0]  # the first forward already sees noisy embeddings
    embeddings = trainer.model.get_input_embeddings()
    assert not embeddings._forward_hooks and not hasattr(embeddings, "neftune_noise_alpha")  # removed after train()
    ids = torch.tensor([[1, 2, 3]])
    trainer.model.train()
    torch.testing.assert_close(embeddings(ids), embeddings.weight[ids])  # no noise any more, even in train mode


@pytest.mark.hf
def test_neftune_losses_equal_transformers(tmp_path):
    ours = llama_losses("lathe", tmp_path / "lathe", neftune_noise_alpha=5.0)[1]
    theirs = llama_losses("transformers", tmp_path / "transformers", neftune_noise_alpha=5.0)[1]
    assert ours == theirs  # the same noise from the same seed: bit for bit


def test_neftune_needs_input_embeddings(tmp_path):
    args = training_args(tmp_path, max_steps=1, neftune_noise_alpha=5.0)
    trainer = make_trainer(model=Regression(), args=args, train_dataset=regression_items(4))
    with pytest.raises(ValueError, match="neftune_noise_alpha.*get_input_embeddings"):
        trainer.train()


@pytest.mark.parametrize("library", BOTH)
def test_tf32_without_an_ampere_gpu(tmp_path, library):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the refusal is for machines without TF32")
    with pytest.raises(ValueError, match="(?i)tf32|ampere"):
        training_args(tmp_path, library, tf32=True)
    training_args(tmp_path, library, tf32=False)  # nothing to switch off: accepted, as in transformers


class CastingRegression(Regression):
    """Casts its float inputs to its weights' dtype, as an embedding layer does for a language model."""

    def forward(self, x, labels=None):
        dtype = self.linear.weight.dtype
        return super().forward(x.to(dtype), None if labels is None else labels.to(dtype))


@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
@pytest.mark.parametrize("library", BOTH)
def test_full_eval_casts_the_model_outside_training(tmp_path, library, dtype_name):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    model = CastingRegression()
    reference = Regression()
    items = regression_items(6)
    options = {f"{dtype_name}_full_eval": True, "use_cpu": True, "per_device_eval_batch_size": 6}
    args = training_args(tmp_path, library, **options)
    trainer = make_trainer(library, model=model, args=args, eval_dataset=items)
    loss = trainer.evaluate()["eval_loss"]
    assert model.linear.weight.dtype == dtype  # cast, and it stays cast (transformers too)
    x = torch.stack([i["x"] for i in items]).to(dtype)
    y = torch.stack([i["labels"] for i in items]).to(dtype)
    expected = ((reference.to(dtype).linear(x).squeeze(-1) - y) ** 2).mean()
    assert loss == pytest.approx(float(expected), rel=1e-6)
    assert loss != pytest.approx(trainer_loss_in_float32(tmp_path, items), rel=1e-6)


def trainer_loss_in_float32(tmp_path, items):
    args = training_args(tmp_path / "fp32", per_device_eval_batch_size=6)
    return make_trainer(model=CastingRegression(), args=args, eval_dataset=items).evaluate()["eval_loss"]


def test_full_eval_does_not_cast_during_training(tmp_path):
    args = training_args(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=1, bf16_full_eval=True)
    model = CastingRegression()
    make_trainer(model=model, args=args, train_dataset=regression_items(8), eval_dataset=regression_items(4)).train()
    assert model.linear.weight.dtype == torch.float32  # evaluation inside train() keeps the training dtype


@pytest.mark.parametrize("library", BOTH)
def test_torch_empty_cache_steps(tmp_path, library, monkeypatch):
    calls = []
    if library == "lathe":
        import lathe.train.runtime as runtime

        monkeypatch.setattr(runtime, "empty_device_cache", lambda: calls.append(1))
    else:
        import transformers.trainer

        monkeypatch.setattr(transformers.trainer, "clear_device_cache", lambda *a, **k: calls.append(1))
    args = training_args(tmp_path, library, max_steps=4, gradient_accumulation_steps=2, torch_empty_cache_steps=2)
    make_trainer(library, model=Regression(), args=args, train_dataset=regression_items(16)).train()
    assert len(calls) == 4  # steps 0 and 2, after each of their 2 micro-batches
    for wrong in (0, -1, 1.0, "none"):
        with pytest.raises(ValueError, match="torch_empty_cache_steps"):
            training_args(tmp_path, library, torch_empty_cache_steps=wrong)


MEMORY_KEYS = {
    "train": {"before_init_mem_cpu", "init_mem_cpu_alloc_delta", "init_mem_cpu_peaked_delta"}
    | {"train_mem_cpu_alloc_delta", "train_mem_cpu_peaked_delta"},
    "eval": {"eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta"},
    "test": {"test_mem_cpu_alloc_delta", "test_mem_cpu_peaked_delta"},
}


def memory_run(library, output_dir, skip: bool, hold: list | None = None):
    base = library_module(library).TrainerCallback

    class Allocate(base):
        def on_step_end(self, args, state, control, **kwargs):
            if hold is not None and not hold:
                hold.append(np.ones(64 * 2**20, dtype=np.uint8))  # 64 MiB, kept until the test ends

    args = training_args(output_dir, library, max_steps=2, skip_memory_metrics=skip, eval_strategy="no")
    items = regression_items(8)
    trainer = make_trainer(
        library, model=Regression(), args=args, train_dataset=items, eval_dataset=items, callbacks=[Allocate()]
    )
    train = trainer.train().metrics
    return trainer, train, trainer.evaluate(), trainer.predict(items).metrics


@pytest.mark.skipif(torch.cuda.is_available(), reason="the names on a GPU also carry *_mem_gpu_*")
@pytest.mark.parametrize("library", BOTH)
def test_memory_metrics_names(tmp_path, library):
    pytest.importorskip("psutil")
    _, train, evaluation, test = memory_run(library, tmp_path, skip=False)
    assert MEMORY_KEYS["train"] <= set(train)
    assert MEMORY_KEYS["eval"] <= set(evaluation) and not set(evaluation) & MEMORY_KEYS["train"]
    assert MEMORY_KEYS["test"] <= set(test)
    trainer, train, evaluation, test = memory_run(library, tmp_path / "skip", skip=True)
    every = set().union(*MEMORY_KEYS.values())
    assert not (set(train) | set(evaluation) | set(test)) & every
    assert not any("_mem_" in key for log in trainer.state.log_history for key in log)


def test_memory_metrics_measure_what_training_holds(tmp_path):
    """In a fresh process: one that ran other tests holds memory they freed, which the allocator hands back
    during training, so its RSS deltas say nothing about this run (seen in the full suite)."""
    pytest.importorskip("psutil")
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    script = (
        "import json, sys; from tests.train.test_argument_effects import memory_run; hold = []; "
        f"_, train, _, _ = memory_run('lathe', {str(tmp_path)!r}, skip=False, hold=hold); print(json.dumps(train))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    train = json.loads(done.stdout.strip().splitlines()[-1])
    assert train["train_mem_cpu_alloc_delta"] >= 60 * 2**20  # the 64 MiB a callback kept
    assert train["before_init_mem_cpu"] > 0


def test_memory_metrics_need_psutil(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "psutil", None)
    args = training_args(tmp_path, skip_memory_metrics=False)
    with pytest.raises(ImportError, match="psutil"):
        make_trainer(model=Regression(), args=args)


def test_past_index_is_refused(tmp_path):
    with pytest.raises(ValueError, match="past_index"):
        training_args(tmp_path, past_index=1)
