"""Chunked (fused linear) cross-entropy: the same loss and gradients as the full-logits path, across chunk
sizes, with padding, num_items_in_batch, label smoothing, softcapping, packed rows, tied embeddings, a
LoRA head, DDP and FSDP2; evaluation without logits; the path chosen and logged."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from lathe import Trainer, TrainingArguments
from lathe.train.loss.chunked import chunked_causal_lm_loss, default_chunk_size

transformers = pytest.importorskip("transformers")

VOCAB = 97


def reference_loss(hidden, head, labels, smoothing=0.0, softcap=None, num_items=None):
    logits = head(hidden).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), shifted.reshape(-1), reduction="sum", label_smoothing=smoothing
    )
    return total / (num_items if num_items is not None else (shifted != -100).sum())


def grads(loss, tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("chunk_size", [1, 5, 16, 1000, None])
@pytest.mark.parametrize(
    "smoothing, softcap, bias, num_items", [(0.0, None, False, None), (0.1, None, True, 37), (0.2, 5.0, False, None)]
)
def test_loss_and_gradients_equal_the_full_logits_path(chunk_size, smoothing, softcap, bias, num_items):
    torch.manual_seed(0)
    head = torch.nn.Linear(24, VOCAB, bias=bias)
    hidden = torch.randn(3, 11, 24, requires_grad=True)
    labels = torch.randint(0, VOCAB, (3, 11))
    labels[0, :4] = -100  # a prompt
    labels[2, 7:] = -100  # padding
    params = [hidden, head.weight] + ([head.bias] if bias else [])
    expected = reference_loss(hidden, head, labels, smoothing, softcap, num_items)
    got = chunked_causal_lm_loss(
        hidden,
        head,
        labels,
        num_items_in_batch=None if num_items is None else torch.tensor(num_items),
        label_smoothing=smoothing,
        softcap=softcap,
        chunk_size=chunk_size,
    )
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    for ours, theirs in zip(grads(got, params), grads(expected, params)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)


def test_no_grad_and_a_frozen_head_give_the_same_loss():
    torch.manual_seed(1)
    head = torch.nn.Linear(8, VOCAB, bias=False).requires_grad_(False)
    hidden = torch.randn(2, 6, 8, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, 6))
    expected = reference_loss(hidden, head, labels)
    got = chunked_causal_lm_loss(hidden, head, labels, chunk_size=4)
    (grad,) = grads(got, [hidden])
    torch.testing.assert_close(grad, grads(expected, [hidden])[0], rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        assert chunked_causal_lm_loss(hidden, head, labels, chunk_size=4).item() == pytest.approx(expected.item())


def test_default_chunk_size_keeps_a_chunk_of_logits_near_32_million_elements():
    assert default_chunk_size(151_936) == 256
    assert default_chunk_size(32_000) == 1024
    assert default_chunk_size(262_144) == 128
    assert default_chunk_size(10) == 2**22  # a small vocabulary: one chunk holds the whole batch


def tiny_model(model_type="qwen2", tied=False, seed=0, **extra):
    config_class = transformers.AutoConfig.for_model
    config = config_class(
        model_type,
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        **extra,
    )
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config)


def batch(rows=3, length=10, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (rows, length), generator=generator)
    labels = input_ids.clone()
    labels[0, :3] = -100
    labels[-1, -4:] = -100
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, -4:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def trainer_for(model, tmp_path, **kwargs):
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True, learning_rate=0.05, **kwargs
    )
    return Trainer(model=model, args=args)


def loss_and_grads(trainer, inputs, num_items=None):
    model = trainer.model
    model.zero_grad()
    loss = trainer.compute_loss(model, inputs, num_items_in_batch=num_items)
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_step(chunked, standard):
    assert chunked[0] == pytest.approx(standard[0], abs=1e-6)
    assert chunked[1].keys() == standard[1].keys()
    for name in standard[1]:
        torch.testing.assert_close(chunked[1][name], standard[1][name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "model_type, tied, extra",
    [
        ("qwen2", False, {}),
        ("llama", True, {}),
        ("gemma2", True, {"final_logit_softcapping": 2.0, "attn_implementation": "eager"}),
    ],
)
@pytest.mark.parametrize("smoothing, num_items", [(0.0, None), (0.0, 19), (0.1, None)])
def test_the_trainer_computes_the_models_loss_and_gradients(tmp_path, model_type, tied, extra, smoothing, num_items):
    inputs = batch()
    items = None if num_items is None else torch.tensor(num_items)
    results = []
    for setting in ("no", "yes"):
        model = tiny_model(model_type, tied, **extra)
        trainer = trainer_for(
            model,
            tmp_path,
            chunked_cross_entropy=setting,
            chunked_cross_entropy_size=7,
            label_smoothing_factor=smoothing,
        )
        assert (trainer._lm_loss is not None) == (setting == "yes")
        results.append(loss_and_grads(trainer, inputs, items))
    assert_same_step(results[1], results[0])


def test_packed_rows_with_position_ids_give_the_same_loss(tmp_path):
    """Two examples packed into one row: position_ids restart, the boundary label is -100."""
    inputs = batch(rows=1, length=12)
    inputs["position_ids"] = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
    inputs["labels"][0, 5] = -100
    results = [
        loss_and_grads(trainer_for(tiny_model(), tmp_path, chunked_cross_entropy=setting), inputs)
        for setting in ("no", "yes")
    ]
    assert_same_step(results[1], results[0])


def test_a_lora_head_trains_through_the_checkpointed_chunks(tmp_path):
    peft = pytest.importorskip("peft")
    results = []
    for setting in ("no", "yes"):
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["lm_head", "q_proj"], lora_dropout=0.0)
        model = peft.get_peft_model(tiny_model(), config)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # non-zero B so the head's adapter changes the loss
                torch.nn.init.normal_(parameter, std=0.1)
        trainer = trainer_for(model, tmp_path, chunked_cross_entropy=setting, chunked_cross_entropy_size=4)
        results.append(loss_and_grads(trainer, batch(), torch.tensor(20)))
    assert any("lm_head.lora_A" in name for name in results[0][1])
    assert_same_step(results[1], results[0])


@pytest.mark.slow
def test_training_steps_and_evaluation_match_and_evaluation_builds_no_logits(tmp_path):
    data = [{k: v[0] for k, v in batch(1, 10, seed).items()} for seed in range(8)]
    shapes, runs = [], {}
    for setting in ("no", "yes"):
        model = tiny_model()
        model.lm_head.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.shape)))
        args = TrainingArguments(
            output_dir=str(tmp_path / setting),
            use_cpu=True,
            report_to="none",
            disable_tqdm=True,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            max_steps=2,
            logging_steps=1,
            learning_rate=0.05,
            optim="sgd",  # Adam turns rounding noise in exactly-zero gradients (k_proj's bias) into whole steps
            chunked_cross_entropy=setting,
        )
        trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4])
        trainer.train()
        shapes.clear()
        metrics = trainer.evaluate()
        runs[setting] = ([e["loss"] for e in trainer.state.log_history if "loss" in e], metrics["eval_loss"], model)
        assert all(shape[1] == (0 if setting == "yes" else 10) for shape in shapes), shapes
        if setting == "yes":  # predictions that are kept need the logits: predict() builds them
            shapes.clear()
            output = trainer.predict(data[:2])
            logits = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
            assert logits.shape == (2, 10, VOCAB) and shapes == [(2, 10, VOCAB)]
    assert runs["yes"][0] == pytest.approx(runs["no"][0], abs=1e-5)
    assert runs["yes"][1] == pytest.approx(runs["no"][1], abs=1e-5)
    for (name, ours), theirs in zip(runs["yes"][2].named_parameters(), runs["no"][2].parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5, msg=name)


def test_unsupported_models_are_refused_or_run_the_standard_path(tmp_path, caplog):
    granite = tiny_model("granite", logits_scaling=4.0)
    with pytest.raises(ValueError, match="chunked_cross_entropy='yes' cannot be used: model type 'granite'"):
        trainer_for(granite, tmp_path, chunked_cross_entropy="yes")
    with caplog.at_level(logging.INFO, logger="lathe.train.loss.causal_lm"):
        trainer = trainer_for(granite, tmp_path, chunked_cross_entropy="auto")
    assert trainer._lm_loss is None
    assert "the model's own (full logits), because model type 'granite'" in caplog.text
    with pytest.raises(ValueError, match="compute_loss_func"):
        Trainer(
            model=tiny_model(),
            args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, chunked_cross_entropy=True),
            compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.logits.sum(),
        )
    with pytest.raises(ValueError, match="chunked_cross_entropy must be one of|chunked_cross_entropy"):
        TrainingArguments(output_dir=str(tmp_path), chunked_cross_entropy="sometimes")


def test_use_liger_kernel_without_liger_or_a_gpu_runs_the_chunked_loss_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="lathe.train.loss.causal_lm"):
        trainer = trainer_for(tiny_model(), tmp_path, use_liger_kernel=True)
    assert trainer._lm_loss is not None
    assert "use_liger_kernel:" in caplog.text and "chunked cross-entropy instead" in caplog.text
    assert "Causal-LM loss: chunked cross-entropy" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("run", ["chunked_ddp", "chunked_fsdp"])
def test_two_ranks_with_the_chunked_loss_train_like_one_process_with_the_models_loss(tmp_path, fsdp_ranks, run):
    """DDP and FSDP2 on 2 CPU processes, tied embeddings (the head's gradient meets the embedding's):
    the losses and weights of one process with the model's own loss and twice the batch."""
    from tests.train import fsdp_worker
    from tests.train.torchrun_helpers import assert_same_weights

    single = fsdp_worker.run(str(tmp_path / "single"), {"accumulation": 2, "tied": True, "optim": "sgd", "batch": 4})
    ranks = fsdp_ranks[1][run]  # tests/train/conftest.py: the same, on 2 ranks with batch 2 and the chunked loss
    assert ranks["world_size"] == 2 and len(ranks["losses"]) == len(single["losses"]) == 6
    assert ranks["losses"] == pytest.approx(single["losses"], abs=1e-6)
    assert_same_weights(ranks["weights"], single["weights"])
    # eval_loss under 2 ranks is transformers' two-rank value (test_distributed), not one process's
    assert math.isfinite(ranks["metrics"]["eval_loss"])


def test_a_compute_loss_func_set_after_init_gets_the_logits_and_the_log_says_so(tmp_path, caplog):
    """The LLM loss variants (DFT, EAFT, ASFT) set compute_loss_func after Trainer.__init__."""
    trainer = trainer_for(tiny_model(), tmp_path, chunked_cross_entropy="auto")
    assert trainer._lm_loss is not None
    seen = []

    def loss_func(outputs, labels, num_items_in_batch=None):
        seen.append(tuple(outputs.logits.shape))
        return outputs.logits.float().mean()

    trainer.compute_loss_func = loss_func
    with caplog.at_level(logging.INFO, logger="lathe.train.loss.causal_lm"):
        trainer.compute_loss(trainer.model, batch())
    assert seen == [(3, 10, VOCAB)] and trainer._lm_loss is None
    assert "the model's own (full logits), because compute_loss_func" in caplog.text


@pytest.mark.slow
def test_the_chunked_loss_compiles_to_the_same_loss_and_gradients():
    torch.manual_seed(2)
    head = torch.nn.Linear(16, VOCAB)
    hidden = torch.randn(2, 10, 16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, 10))
    labels[0, :3] = -100
    compiled = torch.compile(chunked_causal_lm_loss)(hidden, head, labels, chunk_size=4, label_smoothing=0.1)
    expected = reference_loss(hidden, head, labels, smoothing=0.1)
    assert compiled.item() == pytest.approx(expected.item(), rel=1e-6)
    for ours, theirs in zip(grads(compiled, [hidden, head.weight]), grads(expected, [hidden, head.weight])):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
