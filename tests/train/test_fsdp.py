"""FSDP2: fsdp/fsdp_config read as transformers 5 reads them (errors name the key), the blocks that
are sharded, and two CPU processes (gloo, torchrun) with fully_shard training the tiny LLaMA one
process trains with twice the batch: equal losses, final weights (a full model.safetensors that
from_pretrained loads), eval metrics, and an exact resume from a checkpoint written by 2 ranks."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch

from lathe import TrainingArguments
from lathe.train.parallel import fsdp
from tests.train import fsdp_worker
from tests.train.torchrun_helpers import assert_same_weights


def settings(**kwargs):
    return fsdp.settings_from_args(TrainingArguments(output_dir="unused", report_to="none", **kwargs))


def test_settings_read_like_transformers(tmp_path):
    assert settings() is None
    assert settings(fsdp="full_shard auto_wrap") == fsdp.FsdpSettings()
    parsed = settings(
        fsdp="shard_grad_op offload",
        fsdp_config={
            "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
            "activation_checkpointing": "true",
            "min_num_params": "0",
        },
    )
    assert parsed == fsdp.FsdpSettings(
        layer_classes=("LlamaDecoderLayer",),
        reshard_after_forward=False,
        cpu_offload=True,
        activation_checkpointing=True,
    )
    config = tmp_path / "fsdp.json"
    config.write_text(json.dumps({"auto_wrap_policy": "size_based_wrap", "min_num_params": 100}))
    assert settings(fsdp=True, fsdp_config=str(config)) == fsdp.FsdpSettings(
        auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=100
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(fsdp=True, fsdp_config={"transformer_layer_cls_to_warp": "X"}),
            "did you mean 'transformer_layer_cls_to_wrap'",
        ),
        (
            dict(fsdp=True, fsdp_config={"backward_prefetch": "BACKWARD_PRE"}),
            "fsdp_config['backward_prefetch'] is an FSDP1 setting",
        ),
        (dict(fsdp=True, fsdp_config={"version": 1}), "must be 2"),
        (dict(fsdp="hybrid_shard"), "'hybrid_shard' is an FSDP1 option"),
        (dict(fsdp=True, fsdp_config={"state_dict_type": "SHARDED_STATE_DICT"}), "state_dict_type"),
        (dict(fsdp=True, fsdp_config={"cpu_offload": "maybe"}), "fsdp_config['cpu_offload'] must be true or false"),
        (dict(fsdp=True, fsdp_config="missing.json"), "neither a dict nor the path"),
        (dict(fsdp=True, save_on_each_node=True), "save_on_each_node=True cannot be used with fsdp"),
    ],
)
def test_bad_settings_are_errors_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        settings(**kwargs)


def test_blocks_are_the_models_no_split_modules_or_the_named_classes():
    model = fsdp_worker.model()
    layers = list(model.model.layers)
    assert fsdp.find_blocks(model, fsdp.FsdpSettings()) == layers  # LlamaForCausalLM._no_split_modules
    assert fsdp.find_blocks(model, fsdp.FsdpSettings(layer_classes=("LlamaMLP",))) == [layer.mlp for layer in layers]
    assert fsdp.find_blocks(model, fsdp.FsdpSettings(auto_wrap_policy="NO_WRAP")) == []
    with pytest.raises(ValueError, match="names \\['Block'\\], but LlamaForCausalLM has no module of that class"):
        fsdp.find_blocks(model, fsdp.FsdpSettings(layer_classes=("Block",)))
    # size based: innermost modules first; each parameter belongs to one unit
    by_size = fsdp.find_blocks(model, fsdp.FsdpSettings(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=512))
    assert by_size and all(sum(p.numel() for p in block.parameters()) >= 512 for block in by_size)
    assert model.model.layers[0].mlp.gate_proj in by_size and model.model.layers[0] not in by_size


@pytest.mark.slow
def test_two_fsdp_ranks_train_like_one_process_with_twice_the_batch_and_resume_exactly(tmp_path, fsdp_ranks):
    single = fsdp_worker.run(str(tmp_path / "single"), {"batch": 4, "accumulation": 2})
    folder, ranks = fsdp_ranks
    sharded = ranks["sharded"]  # FSDP_OPTIONS (tests/train/conftest.py): full_shard, checkpoints every 2 steps
    assert sharded["world_size"] == 2 and single["world_size"] == 1
    assert len(sharded["losses"]) == len(single["losses"]) == 6
    for ours, theirs in zip(sharded["losses"], single["losses"]):
        assert ours == pytest.approx(theirs, abs=1e-6)
    for ours, theirs in zip(sharded["grad_norms"], single["grad_norms"]):
        assert ours == pytest.approx(theirs, abs=1e-6)
    assert_same_weights(sharded["weights"], single["weights"])  # the full model.safetensors written by rank 0
    assert sharded["from_pretrained"] is True
    # 11 eval items over 2 ranks x batch 2: eval_loss is then transformers' two-rank value, not one process's
    # (test_distributed.test_two_ranks_evaluate_as_transformers_two_ranks); the evaluation ran and gave a number
    assert math.isfinite(sharded["metrics"]["eval_loss"])

    # the step-2 checkpoint of 2 ranks (full weights, optimizer keyed as in one process, an RNG state per
    # rank) resumed under 2 ranks, mid-epoch: the uninterrupted run's losses after step 2 and its final weights
    checkpoint = folder / "sharded" / "checkpoint-2"
    assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(checkpoint))
    # resumed with the parameters offloaded to CPU between uses (cpu_offload): the same numbers
    resumed = ranks["resumed"]
    assert resumed["losses"] == pytest.approx(
        sharded["losses"], abs=1e-6
    )  # steps 1-2 from the checkpoint's log history
    assert_same_weights(resumed["weights"], sharded["weights"])
    # the same checkpoint resumed by one process, unsharded (twice the batch: the same global batch)
    alone = fsdp_worker.run(str(tmp_path / "alone"), {"batch": 4, "accumulation": 2, "resume": str(checkpoint)})
    assert alone["losses"] == pytest.approx(single["losses"], abs=1e-6)
    assert_same_weights(alone["weights"], single["weights"])


@pytest.mark.slow
def test_tied_embeddings_train_under_fsdp_like_one_process(tmp_path, fsdp_ranks):
    """lm_head and embed_tokens are one parameter: its gradient from both uses is reduced once. With SGD
    the weights agree to 1e-8; with Adam they agree to ~2e-6 only, because Adam divides by the root of
    tiny second moments and so magnifies fp32 rounding differences of the reduction order (a tying
    error would show as differences of the size of an update, ~1e-2)."""
    single = fsdp_worker.run(str(tmp_path / "single"), {"batch": 4, "accumulation": 2, "tied": True, "optim": "sgd"})
    sharded = fsdp_ranks[1]["tied"]  # batch 2, accumulation 2, tied, sgd, full_shard auto_wrap
    assert "lm_head.weight" not in sharded["weights"]  # saved once, under the embedding's name
    assert sharded["losses"] == pytest.approx(single["losses"], abs=1e-6)
    assert_same_weights(sharded["weights"], single["weights"])


def test_a_peft_checkpoint_maps_to_the_wrapped_models_parameter_names(tmp_path):
    # FSDP + LoRA resumes through this (checked by hand: 2 ranks resumed from a 2-rank adapter checkpoint
    # end with the uninterrupted run's adapter, bit for bit, and within 3e-7 of one process's)
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        fsdp_worker.model(), LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "v_proj"])
    )
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter)  # not the zero init, so a mix-up of A and B or of layers shows
    model.save_pretrained(tmp_path)
    weights = fsdp.adapter_weights_by_name(model, str(tmp_path))
    trainable = {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert sorted(weights) == sorted(trainable) and len(weights) == 8
    assert all(torch.equal(weights[name], trainable[name].detach()) for name in weights)
    other = get_peft_model(fsdp_worker.model(), LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["k_proj"]))
    with pytest.raises(ValueError, match="match no parameter of PeftModelForCausalLM"):
        fsdp.adapter_weights_by_name(other, str(tmp_path))


def test_tied_weights_are_saved_under_one_name():
    from transformers import LlamaConfig, LlamaForCausalLM

    tied = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            tie_word_embeddings=True,
        )
    )
    assert fsdp.tied_aliases(tied) == {"lm_head.weight"}
    assert fsdp.tied_aliases(fsdp_worker.model()) == set()
