"""The step maths of preference training, in one place: sequence log-probabilities from logits, the DPO
family of losses (sigmoid, hinge, ipo, orpo, simpo, and the BCO mix-in), the KTO loss and the pairwise
reward-model loss. Pure functions of tensors (no Trainer), so each is tested against a plain statement.

The definitions are those of TRL 0.24 and LLaMA-Factory 0.9.5, written with the same operations in the
same order, so the numbers are bit-identical where LLaMA-Factory computes the same thing. Where it does
not (LLaMA-Factory 0.9.5 never passes `pref_loss` to TRL, so hinge and ipo train the sigmoid loss), lathe
computes the loss the config asks for.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lathe.train.data.labels import IGNORE_INDEX

DPO_LOSSES = ("sigmoid", "hinge", "ipo", "orpo", "simpo")
AVERAGED_LOSSES = ("ipo", "orpo", "simpo")  # these compare mean token log-probs; the others sums


def sequence_log_probs(logits: torch.Tensor, labels: torch.Tensor, ld_alpha: float | None = None):
    """(log p(answer) summed over its tokens, number of answer tokens) per row.

    Logits at position t score the label at t + 1; positions labelled -100 count for nothing. With
    `ld_alpha` (LD-DPO; rows are chosen then rejected halves), the tokens of each answer past the length
    of the shorter answer of its pair count ld_alpha times, so a longer answer is not favoured for its length.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not line up.")
    labels = labels[:, 1:].clone()
    logits = logits[:, :-1, :]
    mask = labels != IGNORE_INDEX
    labels[labels == IGNORE_INDEX] = 0  # any valid index; masked out below
    token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    return summed_log_probs(token_logps, mask, ld_alpha)


def summed_log_probs(token_logps: torch.Tensor, mask: torch.Tensor, ld_alpha: float | None = None):
    """sequence_log_probs from the log-probs of each row's next tokens [rows, T - 1] and their mask."""
    lengths = mask.sum(-1)
    if ld_alpha is None:
        return (token_logps * mask).sum(-1), lengths
    half = token_logps.shape[0] // 2
    shorter = torch.min(lengths[:half], lengths[half:])
    shared_end = torch.argmax(mask.int(), dim=1) + torch.cat([shorter, shorter], dim=0)
    positions = torch.arange(token_logps.shape[-1], device=token_logps.device).expand_as(token_logps)
    shared = positions < shared_end.unsqueeze(1)
    front = (token_logps * (shared * mask).float()).sum(-1)
    rear = (token_logps * (~shared * mask).float()).sum(-1)
    return front + ld_alpha * rear, lengths


def dpo_loss(
    chosen_logps,
    rejected_logps,
    ref_chosen_logps,
    ref_rejected_logps,
    loss_type: str,
    beta: float,
    label_smoothing: float = 0.0,
):
    """(losses, chosen rewards, rejected rewards) per pair for the losses that compare with a reference.

    logits = (chosen - rejected) - (ref chosen - ref rejected); sigmoid: -log sigmoid(beta logits), with
    label smoothing eps mixing in -log sigmoid(-beta logits); hinge: relu(1 - beta logits); ipo:
    (logits - 1 / (2 beta))^2. Rewards are beta (policy - reference) log-probs, detached."""
    logits = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"pref_loss {loss_type!r} has no reference-model form; choose sigmoid, hinge or ipo.")
    chosen_rewards = beta * (chosen_logps - ref_chosen_logps).detach()
    rejected_rewards = beta * (rejected_logps - ref_rejected_logps).detach()
    return losses, chosen_rewards, rejected_rewards


def orpo_loss(chosen_logps, rejected_logps, beta: float) -> torch.Tensor:
    """ORPO on mean token log-probs: the chosen answer's NLL plus beta x -log sigmoid(log odds ratio)."""
    log_odds = (chosen_logps - rejected_logps) - (
        torch.log1p(-torch.exp(chosen_logps)) - torch.log1p(-torch.exp(rejected_logps))
    )
    return -chosen_logps + beta * -F.logsigmoid(log_odds)


def simpo_loss(chosen_logps, rejected_logps, beta: float, gamma: float) -> torch.Tensor:
    """SimPO on mean token log-probs: -log sigmoid(beta (chosen - rejected - gamma / beta))."""
    return -F.logsigmoid(beta * ((chosen_logps - rejected_logps) - gamma / beta))


def reference_free_loss(chosen_logps, rejected_logps, loss_type: str, beta: float, simpo_gamma: float):
    """(losses, chosen rewards, rejected rewards) of orpo / simpo; rewards are beta x policy log-probs."""
    if loss_type == "orpo":
        losses = orpo_loss(chosen_logps, rejected_logps, beta)
    elif loss_type == "simpo":
        losses = simpo_loss(chosen_logps, rejected_logps, beta, simpo_gamma)
    else:
        raise ValueError(f"pref_loss {loss_type!r} needs a reference model; orpo and simpo do not.")
    return losses, beta * chosen_logps.detach(), beta * rejected_logps.detach()


def bco_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float, delta: float):
    """BCO: chosen log-ratios pushed above, rejected below, the running mean `delta` of the rewards."""
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    return -F.logsigmoid((beta * chosen_logratios) - delta) - F.logsigmoid(-(beta * rejected_logratios - delta))


def mix_bco(losses, bco_losses, weight: float):
    """DPO and BCO losses mixed as LLaMA-Factory does: (dpo + w bco) / (1 + w)."""
    return (losses + bco_losses * weight) / (1.0 + weight)


def kto_loss(
    chosen_logratios, rejected_logratios, kl: torch.Tensor, beta: float, chosen_weight: float, rejected_weight: float
):
    """Per-example KTO losses (desirable then undesirable): 1 - sigmoid(beta (logratio - kl)) for a
    desirable answer, 1 - sigmoid(beta (kl - logratio)) for an undesirable one, each weighted; `kl` is the
    batch's clamped KL estimate (see kto_kl)."""
    chosen_losses = 1 - F.sigmoid(beta * (chosen_logratios - kl))
    rejected_losses = 1 - F.sigmoid(beta * (kl - rejected_logratios))
    return torch.cat((chosen_weight * chosen_losses, rejected_weight * rejected_losses), 0)


def kto_kl(policy_kl_logps, ref_kl_logps, mean_across_ranks=None) -> torch.Tensor:
    """The KL estimate of a KTO batch: mean policy - reference log-prob of the mismatched pairs, averaged
    over the processes (every rank then uses the same value), clamped at 0; detached."""
    kl = (policy_kl_logps - ref_kl_logps).mean().detach()
    if mean_across_ranks is not None:
        kl = mean_across_ranks(kl)
    return kl.clamp(min=0)


def pairwise_reward_loss(chosen_scores, rejected_scores) -> torch.Tensor:
    """The reward model's loss: -log sigmoid(chosen score - rejected score), averaged over pairs."""
    return -F.logsigmoid(chosen_scores.float() - rejected_scores.float()).mean()


class RunningMean:
    """The running mean of BCO's rewards (TRL's RunningMoments, mean only: the loss reads nothing
    else). Each update adds one value, the batch's mean reward over all processes, with the same
    float32 arithmetic as TRL; `count` starts at 1e-24 as there."""

    def __init__(self, mean: float = 0.0, count: float = 1e-24):
        self.mean, self.count = mean, count

    def update(self, batch_mean: torch.Tensor, batch_count: int = 1) -> None:
        delta = batch_mean.float() - self.mean
        total = self.count + batch_count
        self.mean += (delta * batch_count / total).item()
        self.count = total
