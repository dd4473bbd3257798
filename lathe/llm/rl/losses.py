"""The GRPO objective: group-normalised advantages, the clipped per-token policy loss with the k3 KL
estimate, and the aggregation of each loss_type, written from the GRPO / DAPO / Dr. GRPO papers and
TRL's documented definitions."""

from __future__ import annotations

import math

import torch

from lathe.llm.rl import ranks


def nan_std(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sample standard deviation (Bessel-corrected) ignoring NaN; NaN where fewer than two values."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(values)).sum(dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(count, float("nan"), dtype=variance.dtype))
    std = torch.sqrt(variance * correction)
    return std.squeeze() if dim is None else std.squeeze(dim)


def advantages_of(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    scale: str,
    aggregation: str = "sum_then_normalize",
):
    """(advantages, weighted rewards, is_std_zero). Rewards are summed with their weights (NaN = skipped),
    centred on the mean of their group of num_generations, and divided by the group's std ("group"), the
    batch's ("batch") or not at all ("none"), plus 1e-4. A completion no function scored gets advantage 0.
    aggregation "normalize_then_sum" (GDPO): each function's rewards normalised in their group first, then
    the weighted sum normalised over the batch (scale_rewards is not read, as TRL)."""
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    if aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.size(1))
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nan_std(grouped, dim=1).unsqueeze(1)
        normalised = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, rewards_per_func.size(1))
        rewards = (normalised * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = nan_std(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std + 1e-4)
        is_std_zero = torch.isclose(std, torch.zeros_like(std))
        return torch.nan_to_num(advantages, nan=0.0), rewards, is_std_zero
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable] = torch.nan
    groups = rewards.view(-1, num_generations)
    mean = torch.nanmean(groups, dim=1).repeat_interleave(num_generations)
    if scale == "batch":
        std = nan_std(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        std = nan_std(groups, dim=1).repeat_interleave(num_generations)
    advantages = rewards - mean
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    is_std_zero = torch.isclose(std, torch.zeros_like(std))
    return torch.nan_to_num(advantages, nan=0.0), rewards, is_std_zero


def per_token_objective(logps, old_logps, ref_logps, advantages, args, mask=None, entropy_mask=None):
    """(per-token loss, per-token KL or None, ratio as the clip metrics read it). The ratio r = exp(logp -
    old_logp), per token, or per sequence (importance_sampling_level "sequence", GSPO: exp of the mean log-ratio
    over the completion's tokens, shape (B, 1)), is clipped to [1 - epsilon, 1 + epsilon_high]; with `delta` the
    unclipped term's r is capped at delta (two-sided clipping). The loss is -min(r A, clip(r) A), times the
    high-entropy token mask where top_entropy_quantile < 1, plus beta times the k3 estimate of KL(policy ||
    reference), weighted by the (uncapped) r when use_bias_correction_kl."""
    log_ratio = logps - old_logps
    if args.importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    kl = None
    if args.beta != 0.0:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        if args.use_bias_correction_kl:
            kl = kl * ratio
    extra = {}
    if args.loss_type == "cispo":  # the clipped, detached ratio weights the log-prob (ScaleRL)
        loss = -torch.clamp(ratio, max=epsilon_high).detach() * advantages * logps
    elif args.loss_type == "sapo":  # a soft gate instead of clipping, its temperature by the advantage's sign
        temperatures = torch.where(advantages > 0, args.sapo_temperature_pos, args.sapo_temperature_neg)
        loss = -torch.sigmoid(temperatures * (ratio - 1)) * 4 / temperatures * advantages
    elif args.loss_type == "vespo":  # a detached gamma weight of the sequence's ratio scales A x log-prob
        extra["phi"] = gamma_weights(advantages, logps - old_logps, mask, args)
        loss = -extra["phi"] * advantages * logps
    else:  # grpo, bnpo, dr_grpo, dapo, luspo: PPO's clipped surrogate
        clipped = torch.clamp(ratio, 1 - args.epsilon, 1 + epsilon_high)
        if args.delta is not None:
            ratio = torch.clamp(ratio, max=args.delta)
        loss = -torch.min(ratio * advantages, clipped * advantages)
    if entropy_mask is not None:
        loss = loss * entropy_mask
    if kl is not None:
        loss = loss + args.beta * kl
    return loss, kl, ratio, extra


@torch.no_grad()
def gamma_weights(advantages, log_ratio, mask, args):
    """VESPO's phi(w) = exp(lambda + k log w - lambda w) of the sequence ratio w = exp(sum of the token
    log-ratios), k and lambda by the advantage's sign; (B, 1), detached."""
    lower = math.log(1e-8)
    log_w = torch.clamp((torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True), lower, 20.0)
    nonnegative = advantages >= 0
    k = torch.where(nonnegative, args.vespo_k_pos, args.vespo_k_neg)
    lam = torch.where(nonnegative, args.vespo_lambda_pos, args.vespo_lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def high_entropy_mask(entropies, mask, quantile: float):
    """The completion tokens whose entropy is at least the (1 - top_entropy_quantile) quantile of every
    process's completion tokens' entropies (TRL's get_high_entropy_mask)."""
    everywhere = ranks.gather(entropies[mask.bool()].float())
    if everywhere.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    threshold = torch.quantile(everywhere, 1 - quantile)
    return ((entropies * mask.float()) >= threshold) & mask.bool()


def aggregate(per_token_loss, mask, args, accumulation_steps: int, num_items_in_batch, training: bool):
    """The micro-batch loss, already divided for gradient accumulation. grpo: mean over tokens of each
    sequence, then over sequences; bnpo: mean over the micro-batch's tokens; dr_grpo: sum over
    (sequences x max_completion_length); dapo: sum over the tokens of the whole generation batch, scaled to
    one accumulation window. Returns (loss, loss before the accumulation division)."""
    masked = per_token_loss * mask
    if args.loss_type in ("grpo", "sapo"):
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif args.loss_type == "luspo":  # each sequence's summed loss, averaged over sequences
        loss = masked.sum(-1).mean()
    elif args.loss_type == "bnpo":
        loss = masked.sum() / mask.sum().clamp(min=1.0)
    elif args.loss_type == "dr_grpo":
        loss = masked.sum() / (per_token_loss.size(0) * args.max_completion_length)
    else:  # dapo, cispo, vespo
        normalizer = num_items_in_batch.clamp(min=1.0) / args.world_size
        if training:
            normalizer = normalizer * accumulation_steps / args.steps_per_generation
        loss = masked.sum() / normalizer
        return loss, loss.detach()
    divisor = accumulation_steps if training else 1
    return loss / divisor, loss.detach()


def masked_mean(values, mask) -> float:
    """The mean over the masked tokens of every process (sums and counts added across processes); of a
    (B, 1) tensor of one value per sequence, the mean over every process's sequences."""
    if values.dim() == 2 and values.size(1) == 1:
        local = torch.stack([values.sum().float(), torch.tensor(float(values.size(0)), device=values.device)])
    else:
        local = torch.stack([(values * mask).sum().float(), mask.sum().float()])
    totals = ranks.total(local)
    return (totals[0] / totals[1].clamp(min=1.0)).item()


def clip_metrics(ratio, advantages, mask, args, extra=None) -> dict:
    """The clip_ratio/* logs: the share of completion tokens (of every process) whose ratio is clipped where it
    matters; the least / most clipped sequence's share over every process's sequences. cispo logs
    cispo_clip_ratio, vespo vespo/phi_seq_mean, sapo nothing (as TRL)."""
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    if args.loss_type == "cispo":
        return {"cispo_clip_ratio": masked_mean(((ratio > epsilon_high) & (advantages > 0)).float(), mask)}
    if args.loss_type == "vespo":
        return {"vespo/phi_seq_mean": masked_mean(extra["phi"], mask)}
    if args.loss_type == "sapo":
        return {}
    low = ((ratio < 1 - args.epsilon) & (advantages < 0)).float()
    high = ((ratio > 1 + epsilon_high) & (advantages > 0)).float()
    region = ((low + high) > 0).float()
    per_sequence = lambda x: x.squeeze(1) if x.size(1) == 1 else (x * mask).sum(-1) / mask.sum(-1)  # noqa: E731
    return {
        "clip_ratio/low_mean": masked_mean(low, mask),
        "clip_ratio/high_mean": masked_mean(high, mask),
        "clip_ratio/region_mean": masked_mean(region, mask),
        "clip_ratio/low_min": _nan_extreme(ranks.gather(per_sequence(low)), torch.min),
        "clip_ratio/high_max": _nan_extreme(ranks.gather(per_sequence(high)), torch.max),
    }


def _nan_extreme(values, reduce) -> float:
    kept = values[~torch.isnan(values)]
    return float("nan") if kept.numel() == 0 else reduce(kept).item()
