"""Quickstart: train a small regression MLP with lathe's Trainer on CPU and print its metrics.

The script is what a transformers.Trainer user would write; only the import differs.
Run: python examples/quickstart.py  (about 10 seconds on 2 CPU cores)
"""

import torch
from torch import nn

from lathe import Trainer, TrainingArguments, set_seed


class Regressor(nn.Module):
    """y = f(x) for 8 features; returns {"loss", "logits"} like a transformers model."""

    def __init__(self, features: int = 8, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, x, labels=None):
        prediction = self.net(x).squeeze(-1)
        loss = nn.functional.mse_loss(prediction, labels) if labels is not None else None
        return {"loss": loss, "logits": prediction}


def make_data(n: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=generator)
    y = torch.sin(x[:, 0]) + x[:, 1] * x[:, 2] - 0.5 * x[:, 3] + 0.05 * torch.randn(n, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def r2_score(eval_prediction):
    predictions, labels = eval_prediction
    residual = ((labels - predictions) ** 2).sum()
    total = ((labels - labels.mean()) ** 2).sum()
    return {"r2": float(1 - residual / total)}


def main():
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir="output/quickstart",
        per_device_train_batch_size=32,
        num_train_epochs=8,
        learning_rate=3e-3,
        warmup_steps=0.05,
        lr_scheduler_type="cosine",
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="r2",
        logging_steps=100,
        report_to="none",
        disable_tqdm=True,
    )
    set_seed(args.seed)  # before the model is built, so its initial weights (and the numbers printed) repeat
    trainer = Trainer(
        model=Regressor(),
        args=args,
        train_dataset=make_data(4096, seed=0),
        eval_dataset=make_data(512, seed=1),
        compute_metrics=r2_score,
    )
    before = trainer.evaluate()
    result = trainer.train()
    after = trainer.evaluate()
    trainer.log_metrics("train", result.metrics)
    trainer.log_metrics("eval", after)
    print(
        f"\nheld-out R^2: {before['eval_r2']:.3f} before training -> {after['eval_r2']:.3f} after "
        f"({result.global_step} steps, {result.metrics['train_runtime']:.1f} s)"
    )


if __name__ == "__main__":
    main()
