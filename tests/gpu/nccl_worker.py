"""One process on one GPU in an NCCL process group of world size 1 (a TCP store on 127.0.0.1): a tiny Llama
trained 4 updates of 2 micro-batches wrapped in DistributedDataParallel, or sharded by lathe's FSDP2
(lathe.train.parallel.fsdp.shard_model), each against the same model trained unwrapped; gradients accumulate
under lathe's local_accumulation. Writes {"max_difference", "losses", "backend"} as JSON.

    python tests/gpu/nccl_worker.py ddp|fsdp RESULT.json PORT
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch
import torch.distributed as dist


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).cuda()


def batches():
    for index in range(8):  # the same two micro-batches every update, so the loss falls as they are learned
        generator = torch.Generator().manual_seed(index % 2)
        ids = torch.randint(0, 64, (2, 16), generator=generator).cuda()
        yield {"input_ids": ids, "labels": ids}


def train(model, wrapped=None) -> list[float]:
    from lathe.train.parallel.distributed import local_accumulation

    wrapped = wrapped or model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    no_sync = local_accumulation(wrapped)
    losses = []
    for index, batch in enumerate(batches()):
        last = index % 2 == 1
        with no_sync() if not last else contextlib.nullcontext():
            loss = wrapped(**batch).loss / 2
            loss.backward()
        losses.append(float(loss.detach()))
        if last:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return losses


def main(mode: str, result_file: str, port: str) -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if hasattr(torch.backends, "fp32_precision"):  # true fp32 products, so both runs round alike
        torch.backends.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
    reference = tiny_llama()
    reference_losses = train(reference)
    model = tiny_llama()
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[0])
        losses = train(model, wrapped)
        weights = model.state_dict()
    else:
        from lathe.train import TrainingArguments
        from lathe.train.parallel.fsdp import gather_state, settings_from_args, shard_model

        args = TrainingArguments(output_dir="/tmp/unused", fsdp="full_shard auto_wrap", report_to="none")
        shard_model(model, args, settings_from_args(args))
        losses = train(model)
        weights, _ = gather_state(model)
    expected = reference.state_dict()
    difference = max(float((weights[name].cuda().float() - expected[name].float()).abs().max()) for name in weights)
    result = {"max_difference": difference, "losses": losses, "reference_losses": reference_losses}
    result["backend"] = dist.get_backend()
    dist.destroy_process_group()
    with open(result_file, "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main(*sys.argv[1:4])
