"""The memory plan under several processes (lathe/llm/memory/sharding.py): which terms FSDP2 and DeepSpeed
ZeRO 1/2/3 divide by the world size, what FSDP2 gathers whole while computing (against the model's own
blocks and root), DDP's buckets, reading the `fsdp` / `deepspeed` keys, and the printed plan."""

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from lathe.llm.memory.plan import Settings, estimate_memory
from lathe.llm.memory.sharding import Sharding, sharding_of
from tests.llm.test_memory_plan import _llama  # 3 layers, hidden 64, vocabulary 500

transformers = pytest.importorskip("transformers")


def _bytes(module, trainable_only: bool = False, element: int | None = None) -> int:
    return sum(
        param.numel() * (element or param.element_size())
        for param in module.parameters()
        if param.requires_grad or not trainable_only
    )


def _training(world: int, fsdp="", deepspeed=None, fsdp_config=None):
    return SimpleNamespace(
        world_size=world, fsdp=fsdp, fsdp_config=fsdp_config, deepspeed=deepspeed, save_on_each_node=False
    )


def test_fsdp2_full_shard_divides_the_model_terms_and_gathers_the_root_and_two_blocks():
    model = _llama()
    settings = Settings(batch=2, seq_len=64)
    whole = estimate_memory(model, settings)
    sharding = sharding_of(_training(2, fsdp="full_shard auto_wrap"))
    assert sharding == Sharding("fsdp2", 2, True, True, True, reference=True, gathers=True)
    sharded = estimate_memory(model, dataclasses.replace(settings, sharding=sharding))
    assert sharded.weights == whole.weights // 2 and sharded.gradients == whole.gradients // 2
    assert sharded.optimizer == whole.optimizer // 2 and sharded.optimizer_step == whole.optimizer_step // 2
    assert sharded.activations == whole.activations and sharded.logits == whole.logits  # the batch is per device
    # The root (embeddings, head, final norm) stays whole from forward to backward; a block and the next
    # one are gathered; one block's and the root's gradients are whole before their reduce-scatter.
    inner = model.model
    root = _bytes(inner.embed_tokens) + _bytes(model.lm_head) + _bytes(inner.norm)
    block = _bytes(inner.layers[0])
    assert sharded.gathered == root + 2 * block + root + block
    assert sharded.peak < whole.peak
    # shard_grad_op (reshard_after_forward false): every block stays gathered from forward to backward.
    kept = estimate_memory(
        model, dataclasses.replace(settings, sharding=sharding_of(_training(2, fsdp="shard_grad_op")))
    )
    assert kept.gathered == root + 3 * block + root + block
    # Under bf16 mixed precision the parameters are gathered in bf16, the gradients reduced in fp32.
    half = estimate_memory(model, dataclasses.replace(settings, sharding=sharding, half=True))
    assert half.gathered == (root + 2 * block) // 2 + root + block


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_zero_stages_shard_optimizer_then_gradients_then_weights(stage):
    model = _llama()
    settings = Settings(batch=2, seq_len=64, stage="dpo", reference_copy=True)
    whole = estimate_memory(model, settings)
    sharding = sharding_of(_training(4, deepspeed={"zero_optimization": {"stage": stage}}))
    plan = estimate_memory(model, dataclasses.replace(settings, sharding=sharding))
    assert plan.optimizer == whole.optimizer // 4
    assert plan.gradients == (whole.gradients // 4 if stage >= 2 else whole.gradients)
    assert plan.weights == (whole.weights // 4 if stage == 3 else whole.weights)
    assert plan.reference == whole.reference  # DeepSpeed leaves the frozen reference whole on every process
    assert plan.gathered == (2 * _bytes(model.model.layers[0]) + _bytes(model.model.layers[0]) if stage == 3 else 0)
    assert "DeepSpeed ZeRO stage" in plan.notes[-1] and "not modelled" in plan.notes[-1]


def test_ddp_holds_everything_plus_its_gradient_buckets_and_one_process_nothing_more():
    model = _llama()
    settings = Settings(batch=2, seq_len=64)
    whole = estimate_memory(model, settings)
    ddp = estimate_memory(model, dataclasses.replace(settings, sharding=sharding_of(_training(2))))
    assert ddp.buckets == whole.gradients == _bytes(model, trainable_only=True)
    assert ddp.peak == whole.peak + ddp.buckets
    assert sharding_of(_training(1, fsdp="full_shard")) is None  # one process: nothing is sharded


def test_fsdp2_shards_the_reference_like_the_policy(tmp_path):
    model = _llama()
    settings = Settings(batch=2, seq_len=64, stage="kto", reference_copy=True, kl_seq_len=64)
    whole = estimate_memory(model, settings)
    sharding = sharding_of(_training(2, fsdp="full_shard"))
    sharded = estimate_memory(model, dataclasses.replace(settings, sharding=sharding))
    assert sharded.reference == whole.reference // 2 == _bytes(model) // 2


def test_the_plan_of_a_sharded_run_is_printed(tiny_model_dir, tmp_path, capsys):
    from lathe.llm.workflows.stages import run_train
    from tests.llm.test_memory_plan import _run_config

    config = _run_config(tiny_model_dir, tmp_path, fsdp="full_shard auto_wrap")
    config.processes = 2  # as a dry run before launch plans for 2 processes (NPROC_PER_NODE=2)
    run_train(config, dry_run=True)
    out = capsys.readouterr().out
    assert "note: FSDP2 over 2 processes: weights, gradients, optimizer state 1/2 per process" in out
    assert ", gathered while computing " in out and "assumes each holds the whole model" not in out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_the_fsdp2_plan_is_within_20_percent_of_two_cpu_processes():
    # bench/memory_plan_accuracy.py fsdp's first row: weights, gradients and optimizer state most of the peak.
    import json
    import socket
    import subprocess
    import sys

    spec = {
        **{"vocab": 512, "hidden": 512, "intermediate": 1536, "layers": 4, "heads": 8, "kv_heads": 4},
        **{"batch": 1, "seq_len": 64, "checkpointing": False},
        "keys": {"finetuning_type": "full", "fsdp": "full_shard auto_wrap"},
    }
    root = Path(__file__).resolve().parents[2]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    probe = str(Path(__file__).with_name("memory_probe.py"))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}", probe]
    done = subprocess.run([*command, json.dumps([spec])], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith('{"measured"')][-1])
    assert 0.8 <= result["planned"] / result["measured"] <= 1.2, result
    # Each process's weights term is half of the whole model's.
    assert result["plan"]["weights"] * 2 == pytest.approx(spec_weights(spec), rel=0.01)


def spec_weights(spec: dict) -> int:
    """fp32 bytes of the spec's Llama (untied head)."""
    hidden, inter, heads, kv_heads = spec["hidden"], spec["intermediate"], spec["heads"], spec["kv_heads"]
    kv = hidden // heads * kv_heads
    layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden
    return 4 * (spec["layers"] * layer + 2 * spec["vocab"] * hidden + hidden)
