"""A tiny LLaMA trained by the Trainer, run under torchrun (with DDP, or FSDP2 when options say
fsdp) by tests/train/test_fsdp.py and test_distributed_checkpoints.py, and in-process for the
one-process reference: writes the final weights, the logged losses and eval metrics as JSON from rank 0."""

from __future__ import annotations

import os
import time

import torch

from lathe import Trainer, TrainerCallback, TrainingArguments


class DieAt(TrainerCallback):
    """Rank 1 dies (no clean-up, as when killed) at the end of update `step`, or hangs there."""

    def __init__(self, step: int, hang: bool = False):
        self.step = step
        self.hang = hang

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and args.process_index == 1:
            if self.hang:
                time.sleep(600)
            os._exit(3)


def model(tied: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=16,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config)


def dataset(count: int) -> list[dict]:
    generator = torch.Generator().manual_seed(7)
    items = []
    for _ in range(count):
        input_ids = torch.randint(0, 32, (8,), generator=generator)
        labels = input_ids.clone()
        # a different number of trained tokens per item: normalising by the global count matters
        labels[: int(torch.randint(0, 6, (1,), generator=generator))] = -100
        items.append({"input_ids": input_ids, "labels": labels, "attention_mask": torch.ones(8, dtype=torch.long)})
    return items


def arguments(output_dir: str, options: dict) -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=options["batch"],
        per_device_eval_batch_size=2,
        gradient_accumulation_steps=options.get("accumulation", 1),
        num_train_epochs=options.get("epochs", 2),
        max_steps=options.get("max_steps", -1),
        learning_rate=0.01,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        seed=3,
        use_cpu=True,
        dataloader_pin_memory=False,
        save_strategy=options.get("save_strategy", "no"),
        save_steps=options.get("save_steps", 500),
        fsdp=options.get("fsdp"),
        fsdp_config=options.get("fsdp_config"),
        ddp_timeout=options.get("ddp_timeout", 1800),
        optim=options.get("optim", "adamw_torch"),
        chunked_cross_entropy=options.get("chunked", "no"),
        chunked_cross_entropy_size=options.get("chunk_size"),
        **options.get("ddp", {}),
    )


def run(output_dir: str, options: dict) -> dict:
    args = arguments(output_dir, options)
    callbacks = [DieAt(options["die_at_step"], options.get("hang", False))] if "die_at_step" in options else []
    trainer = Trainer(
        model=model(options.get("tied", False)),
        args=args,
        train_dataset=dataset(24),
        eval_dataset=dataset(11),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=options.get("resume"))
    metrics = trainer.evaluate()
    trainer.save_model(output_dir + "/final")  # under FSDP: gathered from the shards, written by rank 0
    result = {
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "grad_norms": [entry["grad_norm"] for entry in trainer.state.log_history if "grad_norm" in entry],
        "metrics": metrics,
        "world_size": args.world_size,
        "rank": args.process_index,
    }
    wrapper = trainer.model_wrapped
    if hasattr(wrapper, "bucket_bytes_cap"):  # DistributedDataParallel: the options it was built with
        result["ddp"] = {
            "find_unused_parameters": wrapper.find_unused_parameters,
            "broadcast_buffers": wrapper.broadcast_buffers,
            "bucket_bytes_cap": wrapper.bucket_bytes_cap,
        }
    if args.should_save:
        from safetensors.torch import load_file
        from transformers import LlamaForCausalLM

        weights = load_file(output_dir + "/final/model.safetensors")
        result["weights"] = {k: v.tolist() for k, v in weights.items()}
        loaded = LlamaForCausalLM.from_pretrained(output_dir + "/final").state_dict()
        result["from_pretrained"] = all(torch.equal(loaded[k], v) for k, v in weights.items())
    return result


if __name__ == "__main__":
    from tests.train.torchrun_helpers import worker_main

    worker_main(run)
