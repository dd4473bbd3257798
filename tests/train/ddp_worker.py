"""A training job run under torchrun by tests/train/test_distributed.py (and in-process for the
one-process reference): writes the final weights, the logged losses and eval metrics as JSON."""

from __future__ import annotations

import torch
from torch import nn

from lathe import Trainer, TrainingArguments


class TokenModel(nn.Module):
    """A tiny LM-like model whose loss is a sum over label tokens divided by num_items_in_batch."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 20)

    def forward(self, input_ids, labels=None, num_items_in_batch=None, **kwargs):  # **kwargs: gets num_items_in_batch
        logits = self.head(torch.tanh(self.embed(input_ids)))
        if labels is None:
            return {"logits": logits}
        loss = nn.functional.cross_entropy(logits.view(-1, 20), labels.view(-1), ignore_index=-100, reduction="sum")
        count = num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum()
        return {"loss": loss / count, "logits": logits}


def dataset(count: int) -> list[dict]:
    generator = torch.Generator().manual_seed(5)
    items = []
    for _ in range(count):
        input_ids = torch.randint(0, 20, (6,), generator=generator)
        labels = torch.randint(0, 20, (6,), generator=generator)
        # a different number of trained tokens per item: normalising by a count matters
        labels[: int(torch.randint(0, 5, (1,), generator=generator))] = -100
        items.append({"input_ids": input_ids, "labels": labels})
    return items


def accuracy(prediction):
    predicted = prediction.predictions.argmax(-1)
    mask = prediction.label_ids != -100
    return {"accuracy": float((predicted == prediction.label_ids)[mask].mean()), "rows": int(len(prediction.label_ids))}


def run(output_dir: str, options: dict) -> dict:
    torch.manual_seed(0)
    trainer_class, arguments_class = Trainer, TrainingArguments
    if options.get("implementation") == "transformers":  # the same job on transformers' Trainer, for its numbers
        from transformers import Trainer as trainer_class
        from transformers import TrainingArguments as arguments_class
    args = arguments_class(
        output_dir=output_dir,
        per_device_train_batch_size=options["batch"],
        per_device_eval_batch_size=2,  # eval_loss is a mean per batch: same batches on both sides
        gradient_accumulation_steps=options.get("accumulation", 1),
        num_train_epochs=options.get("epochs", 2),
        learning_rate=0.1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=3,
        use_cpu=True,
        dataloader_pin_memory=False,
    )
    trainer = trainer_class(
        model=TokenModel(),
        args=args,
        train_dataset=dataset(options.get("train_items", 32)),
        eval_dataset=dataset(options.get("eval_items", 13)),
        compute_metrics=accuracy,
    )
    trainer.train()
    metrics = trainer.evaluate()
    result = {
        "weights": {k: v.tolist() for k, v in trainer.model.state_dict().items()},
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "metrics": metrics,
        "world_size": args.world_size,
        "rank": args.process_index,
    }
    return result


if __name__ == "__main__":
    from tests.train.torchrun_helpers import worker_main

    worker_main(run)
