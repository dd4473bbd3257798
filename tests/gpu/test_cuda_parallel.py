"""NCCL on one GPU (DDP and lathe's FSDP2 in a process group of world size 1, each against the unwrapped model)
and QLoRA 4-bit through bitsandbytes where it is installed. Marked `gpu`: skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.gpu.cuda_helpers import logged, token_rows

pytestmark = pytest.mark.gpu

REPOSITORY = Path(__file__).resolve().parents[2]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_nccl_data_parallel_on_one_gpu_matches_the_unwrapped_model(tmp_path, mode):
    result_file = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=str(REPOSITORY))
    command = [sys.executable, str(REPOSITORY / "tests/gpu/nccl_worker.py"), mode, str(result_file), str(free_port())]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=REPOSITORY)
    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads(result_file.read_text())
    assert result["backend"] == "nccl"
    # One rank: the all-reduce (DDP) and reduce-scatter (FSDP2) of a world of 1 leave the gradients as they are.
    assert result["max_difference"] < 1e-5, result
    assert result["losses"] == pytest.approx(result["reference_losses"], abs=1e-5)
    assert result["losses"][-1] < result["losses"][0]


def test_qlora_4bit_trains_on_cuda(tmp_path):
    pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    from transformers import BitsAndBytesConfig, Qwen2ForCausalLM

    from lathe import Trainer, TrainingArguments
    from tests.gpu.cuda_helpers import tiny_qwen2

    folder = tmp_path / "base"
    tiny_qwen2(hidden_size=128, intermediate_size=256).save_pretrained(folder)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
    )
    model = Qwen2ForCausalLM.from_pretrained(folder, quantization_config=quantization, device_map={"": 0})
    assert any("4bit" in type(module).__name__ for module in model.modules())
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = peft.LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"
    )
    model = peft.get_peft_model(model, lora)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=10,
        learning_rate=5e-3,
        logging_steps=1,
        bf16=True,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
    )
    trainer = Trainer(model=model, args=args, train_dataset=token_rows())
    trainer.train()
    losses, norms = logged(trainer, "loss"), logged(trainer, "grad_norm")
    assert losses[-1] < losses[0]
    assert all(norm > 0 for norm in norms)
