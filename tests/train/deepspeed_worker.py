"""A training job under DeepSpeed ZeRO, run by tests/train/test_deepspeed.py under torchrun (2 CPU
processes) or as one process: writes the final weights, the logged losses and eval metrics as JSON."""

from __future__ import annotations

import torch

from lathe import Trainer, TrainingArguments
from tests.train.ddp_worker import TokenModel, accuracy, dataset


def zero_config(stage: int) -> dict:
    """The shape of LLaMA-Factory's ds_z<stage>_config.json: everything the arguments decide is "auto"."""
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": "auto"},
        "zero_optimization": {
            "stage": stage,
            "overlap_comm": False,
            "contiguous_gradients": True,
            "reduce_bucket_size": "auto",
        },
    }


def run(output_dir: str, options: dict) -> dict:
    torch.manual_seed(0)
    stage = options.get("stage")
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=options["batch"],
        per_device_eval_batch_size=2,
        gradient_accumulation_steps=options.get("accumulation", 1),
        num_train_epochs=options.get("epochs", 2),
        max_steps=options.get("max_steps", -1),
        learning_rate=0.1,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        seed=3,
        use_cpu=True,
        dataloader_pin_memory=False,
        max_grad_norm=options.get("max_grad_norm", 1.0),
        save_strategy="steps" if options.get("save_steps") else "no",
        save_steps=options.get("save_steps") or 500,
        deepspeed=zero_config(stage) if stage is not None else None,
    )
    trainer = Trainer(
        model=TokenModel(),
        args=args,
        train_dataset=dataset(options.get("train_items", 32)),
        eval_dataset=dataset(options.get("eval_items", 13)),
        compute_metrics=accuracy,
    )
    if options.get("stop_after"):
        from lathe.train.callbacks.events import TrainerCallback

        class Stop(TrainerCallback):  # an interruption right after a checkpoint was written
            def on_save(self, args, state, control, **kwargs):
                if state.global_step >= options["stop_after"]:
                    control.should_training_stop = True

        trainer.add_callback(Stop())
    trainer.train(resume_from_checkpoint=options.get("resume"))
    metrics = trainer.evaluate()
    trainer.save_model(output_dir + "/final")
    weights = {k: v.tolist() for k, v in trainer.model.state_dict().items()} if stage != 3 else None
    if args.process_index == 0:
        from safetensors.torch import load_file

        weights = {k: v.tolist() for k, v in load_file(output_dir + "/final/model.safetensors").items()}
    return {
        "weights": weights,
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "grad_norms": [entry["grad_norm"] for entry in trainer.state.log_history if "grad_norm" in entry],
        "metrics": metrics,
        "world_size": args.world_size,
        "rank": args.process_index,
    }


if __name__ == "__main__":
    from tests.train.torchrun_helpers import worker_main

    worker_main(run)
