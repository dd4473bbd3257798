"""The step maths of lathe/train/batching.py called without a Trainer: the loss denominator of an accumulation
window (count_window_items) and training_step's scale decision (loss_scale), with explicit arguments."""

from __future__ import annotations

import torch

from lathe.train import batching

CPU = torch.device("cpu")


def _batch(labels: list[list[int]]) -> dict:
    return {"input_ids": torch.ones(len(labels), len(labels[0]), dtype=torch.long), "labels": torch.tensor(labels)}


def test_the_window_counts_label_tokens_of_all_its_micro_batches():
    window = [_batch([[-100, 5, 6, -100]]), _batch([[7, 8, 9, 10], [-100, -100, 1, -100]])]
    # shifted (a causal LM never predicts from before its first token): labels from position 1 on
    assert int(batching.count_window_items(window, True, True, CPU, False)) == 2 + 3 + 1
    assert int(batching.count_window_items(window, True, False, CPU, False)) == 2 + 4 + 1
    # the loss divides by no count: each micro-batch loss is a mean of its own batch
    assert batching.count_window_items(window, False, True, CPU, False) is None
    # across ranks in one process: the same count
    assert int(batching.count_window_items(window, True, False, CPU, True)) == 7
    # a batch without labels: nothing to count
    assert batching.count_window_items([{"input_ids": torch.ones(1, 3)}], True, True, CPU, False) is None


def test_loss_scale_follows_the_count_unless_the_trainer_says():
    assert batching.loss_scale(counted=True, across_ranks=False, loss_is_scaled_for_ga=None) == (True, 1)
    assert batching.loss_scale(counted=False, across_ranks=True, loss_is_scaled_for_ga=None) == (False, 1)
    assert batching.loss_scale(counted=True, across_ranks=True, loss_is_scaled_for_ga=None) == (True, 1)  # 1 rank
    assert batching.loss_scale(counted=True, across_ranks=False, loss_is_scaled_for_ga=False) == (False, 1)
    assert batching.loss_scale(counted=False, across_ranks=False, loss_is_scaled_for_ga=True) == (True, 1)


def test_k_micro_batches_normalised_by_the_window_count_add_up_to_one_batch():
    torch.manual_seed(0)
    token_losses = torch.rand(2, 6)
    labels = torch.randint(0, 9, (2, 6))
    labels[0, :2] = -100
    whole = token_losses[labels != -100].mean()
    window = [{"labels": labels[:1]}, {"labels": labels[1:]}]
    num_items = batching.count_window_items(window, True, False, CPU, False)
    by_items, world_scale = batching.loss_scale(True, False, None)
    parts = [
        batching.normalise_loss(token_losses[i][labels[i] != -100].sum() / num_items, 2, by_items, world_scale)
        for i in range(2)
    ]
    torch.testing.assert_close(sum(parts), whole)
