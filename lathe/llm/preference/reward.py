"""RewardTrainer (stage rm): the value head's score at each sequence's last token, the pairwise loss
-log sigmoid(chosen - rejected), accuracy (chosen scored higher) in evaluation, and the scores of
do_predict written to generated_predictions.jsonl as LLaMA-Factory writes them."""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from lathe.llm.methods.meter import TokenMeterMixin
from lathe.llm.methods.optimizers import MethodOptimizerMixin
from lathe.llm.preference.losses import pairwise_reward_loss
from lathe.train.trainer import Trainer

PREDICTIONS_FILE = "generated_predictions.jsonl"


def last_token_scores(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The score at each row's last non-padding token (rows are padded on the right)."""
    return values.gather(dim=-1, index=attention_mask.sum(dim=-1, keepdim=True) - 1).squeeze(-1)


class RewardAccuracy:
    """compute_metrics of stage rm: the share of pairs whose chosen answer scores higher."""

    def __call__(self, eval_prediction) -> dict[str, float]:
        chosen, rejected = (np.asarray(scores) for scores in eval_prediction.predictions)
        return {"accuracy": float(np.mean(chosen > rejected))}


class RewardTrainer(TokenMeterMixin, MethodOptimizerMixin, Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False  # a mean over pairs, divided by accumulation only
        self.can_return_loss = True  # evaluation computes the loss although the model takes no labels

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Chosen rows are the first half of the batch, rejected rows the second (PairwiseDataCollator)."""
        values = model(**inputs)
        pairs = inputs["input_ids"].size(0) // 2
        chosen_masks, rejected_masks = torch.split(inputs["attention_mask"], pairs, dim=0)
        chosen_values, rejected_values = torch.split(values, pairs, dim=0)
        chosen_scores = last_token_scores(chosen_values, chosen_masks)
        rejected_scores = last_token_scores(rejected_values, rejected_masks)
        loss = pairwise_reward_loss(chosen_scores, rejected_scores)
        return (loss, (loss, chosen_scores, rejected_scores)) if return_outputs else loss

    def save_predictions(self, predict_results) -> str | None:
        """generated_predictions.jsonl: {"chosen": score, "rejected": score} per pair, rounded to 2 places."""
        if not self.is_world_process_zero():
            return None
        path = os.path.join(self.args.output_dir, PREDICTIONS_FILE)
        os.makedirs(self.args.output_dir, exist_ok=True)
        chosen, rejected = predict_results.predictions
        lines = [
            json.dumps({"chosen": round(float(c), 2), "rejected": round(float(r), 2)}) for c, r in zip(chosen, rejected)
        ]
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines))
        return path
