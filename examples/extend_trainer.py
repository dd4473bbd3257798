"""Extending lathe's Trainer without touching its loop: a callback that decides when to stop, and a
compute_loss override that changes what is trained (a Huber loss for a model that computes none).

The two ways differ on purpose (docs/TRAINER_DESIGN.md). A callback observes the run and steers it with
TrainerControl's flags; the Trainer acts on them at one place in its loop. To change the maths, override
one of the Trainer's documented methods: compute_loss, training_step, prediction_step, evaluate,
evaluation_loop, create_optimizer, create_scheduler, get_train/eval/test_dataloader, log.
The same code runs on transformers.Trainer after changing the import.

Run: python examples/extend_trainer.py  (a few seconds on CPU)
"""

import torch
import torch.nn.functional as F
from torch import nn

from lathe import Trainer, TrainerCallback, TrainingArguments


class Regressor(nn.Module):
    """y = f(x) for 8 features. It returns only its predictions: the loss is HuberTrainer's."""

    def __init__(self, features: int = 8, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


class HuberTrainer(Trainer):
    """compute_loss is the override point for the loss: training (training_step) and evaluation
    (prediction_step, with return_outputs=True) both call it."""

    def __init__(self, *args, delta: float = 0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.delta = delta

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        predictions = model(inputs["x"])
        loss = F.huber_loss(predictions, inputs["labels"], delta=self.delta)
        return (loss, {"logits": predictions}) if return_outputs else loss


class StopAtTargetLoss(TrainerCallback):
    """Decides, never acts: when a logged training loss is at or below `target`, it sets
    should_training_stop, and the Trainer ends the run after that step (saving, evaluating and
    logging the end as usual). It remembers what it saw, for the report below."""

    def __init__(self, target: float):
        self.target = target
        self.logged = []  # (step, loss) of every training log
        self.stopped_at = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logged.append((state.global_step, logs["loss"]))
            if logs["loss"] <= self.target and self.stopped_at is None:
                self.stopped_at = state.global_step
                control.should_training_stop = True


def make_data(n: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=generator)
    y = torch.sin(x[:, 0]) + x[:, 1] * x[:, 2] - 0.5 * x[:, 3] + 0.05 * torch.randn(n, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def main(output_dir: str = "output/extend_trainer", target: float = 0.05, max_steps: int = 2000) -> dict:
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=32,
        max_steps=max_steps,
        learning_rate=3e-3,
        logging_steps=10,
        label_names=["labels"],  # forward(x) takes no labels, so say which column they are
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    stopper = StopAtTargetLoss(target)
    trainer = HuberTrainer(
        model=Regressor(),
        args=args,
        train_dataset=make_data(4096, seed=0),
        eval_dataset=make_data(512, seed=1),
        callbacks=[stopper],
    )
    result = trainer.train()
    metrics = trainer.evaluate()
    print(
        f"stopped at step {result.global_step} of max_steps={max_steps} (target loss {target}); "
        f"held-out Huber loss {metrics['eval_loss']:.4f}"
    )
    return {"trainer": trainer, "stopper": stopper, "result": result, "eval": metrics}


if __name__ == "__main__":
    main()
