"""lathe.llm.preference.losses against the losses written out by hand, one number at a time."""

import math

import pytest
import torch

from lathe.llm.preference import losses


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_sequence_log_probs_sum_the_answer_tokens_only():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[-100, -100, 3, 4, 1], [-100, 2, 6, -100, -100]])
    logps, lengths = losses.sequence_log_probs(logits, labels)
    log_probs = torch.log_softmax(logits, dim=-1)
    expected = [
        sum(log_probs[row, t - 1, labels[row, t]].item() for t in range(1, 5) if labels[row, t] != -100)
        for row in range(2)
    ]
    assert logps.tolist() == pytest.approx(expected, rel=1e-6)
    assert lengths.tolist() == [3, 2]


def test_ld_alpha_weighs_the_tokens_past_the_shorter_answer():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 5)
    labels = torch.tensor([[-100, 1, 2, 3, 4, 0], [-100, 1, 2, -100, -100, -100]])  # chosen 5 tokens, rejected 2
    full, _ = losses.sequence_log_probs(logits, labels)
    same, _ = losses.sequence_log_probs(logits, labels, ld_alpha=1.0)
    shared, _ = losses.sequence_log_probs(logits, labels, ld_alpha=0.0)
    assert same.tolist() == pytest.approx(full.tolist(), rel=1e-6)
    log_probs = torch.log_softmax(logits[0], dim=-1)
    assert shared[0].item() == pytest.approx(log_probs[0, 1].item() + log_probs[1, 2].item(), rel=1e-6)
    assert shared[1].item() == pytest.approx(full[1].item(), rel=1e-6)  # the shorter answer keeps every token


def test_dpo_losses_and_rewards():
    chosen, rejected, ref_chosen, ref_rejected = (torch.tensor([value]) for value in (-10.0, -14.0, -11.0, -13.0))
    logits = (-10 + 14) - (-11 + 13)  # 2
    beta = 0.1
    sigmoid, chosen_rewards, rejected_rewards = losses.dpo_loss(
        chosen, rejected, ref_chosen, ref_rejected, "sigmoid", beta, 0.2
    )
    assert sigmoid.item() == pytest.approx(-0.8 * log_sigmoid(beta * logits) - 0.2 * log_sigmoid(-beta * logits))
    assert (chosen_rewards.item(), rejected_rewards.item()) == pytest.approx((0.1, -0.1))
    assert losses.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, "hinge", beta)[0].item() == pytest.approx(
        1 - 0.2
    )
    assert losses.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, "ipo", beta)[0].item() == pytest.approx(
        (2 - 5) ** 2
    )
    with pytest.raises(ValueError, match="orpo"):
        losses.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, "orpo", beta)


def test_reference_free_losses():
    chosen, rejected = torch.tensor([-0.5]), torch.tensor([-1.5])  # mean token log-probs
    orpo, chosen_rewards, _ = losses.reference_free_loss(chosen, rejected, "orpo", 0.2, 0.5)
    log_odds = (-0.5 + 1.5) - (math.log(1 - math.exp(-0.5)) - math.log(1 - math.exp(-1.5)))
    assert orpo.item() == pytest.approx(0.5 - 0.2 * log_sigmoid(log_odds), rel=1e-6)
    assert chosen_rewards.item() == pytest.approx(-0.1)
    simpo, _, _ = losses.reference_free_loss(chosen, rejected, "simpo", 2.0, 0.3)
    assert simpo.item() == pytest.approx(-log_sigmoid(2.0 * (1.0 - 0.3 / 2.0)), rel=1e-6)


def test_kto_loss_weights_and_kl():
    kl = losses.kto_kl(torch.tensor([-5.0, -7.0]), torch.tensor([-6.0, -6.5]))
    assert kl.item() == pytest.approx(0.25)
    assert losses.kto_kl(torch.tensor([-7.0]), torch.tensor([-6.0])).item() == 0.0  # clamped
    values = losses.kto_loss(torch.tensor([0.5]), torch.tensor([-1.0]), kl, 0.1, 1.0, 1.5)
    expected = [1 - 1 / (1 + math.exp(-0.1 * (0.5 - 0.25))), 1.5 * (1 - 1 / (1 + math.exp(-0.1 * (0.25 + 1.0))))]
    assert values.tolist() == pytest.approx(expected, rel=1e-6)
    assert losses.kto_loss(torch.tensor([]), torch.tensor([-1.0]), kl, 0.1, 1.0, 1.0).shape == (1,)


def test_pairwise_reward_loss_and_bco():
    assert losses.pairwise_reward_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])).item() == pytest.approx(
        -(log_sigmoid(1.0) + log_sigmoid(-1.0)) / 2
    )
    running = losses.RunningMean()
    for value in (1.0, 2.0, 6.0):
        running.update(torch.tensor(value))
    assert running.mean == pytest.approx(3.0, rel=1e-6) and running.count == pytest.approx(3.0)
    bco = losses.bco_loss(
        torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5]), 0.1, 0.01
    )
    assert bco.item() == pytest.approx(-log_sigmoid(0.05 - 0.01) - log_sigmoid(-(-0.05 - 0.01)), rel=1e-6)
    assert losses.mix_bco(torch.tensor([1.0]), torch.tensor([3.0]), 0.5).item() == pytest.approx(2.5 / 1.5)
