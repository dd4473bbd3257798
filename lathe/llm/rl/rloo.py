"""RLOO (REINFORCE Leave-One-Out), as TRL 1.16's RLOOTrainer: GRPO's sampling, scoring and buffering with two
differences. The advantage of a completion is its reward minus the mean reward of the other completions of its
prompt (the leave-one-out baseline), after a sequence-level KL penalty is taken from the reward (beta times the
summed first-order log-ratio old - reference); and the loss is PPO's clipped surrogate on the sequence's ratio
(the exponential of the summed token log-ratios), averaged over the micro-batch's sequences."""

from __future__ import annotations

import torch

from lathe.llm.rl import generation, losses, ranks
from lathe.llm.rl.config import RLOOConfig
from lathe.llm.rl.trainer import GRPOTrainer


def leave_one_out_advantages(rewards: torch.Tensor, num_generations: int, normalize: bool):
    """(advantages, is_std_zero) of the summed (and KL-penalised) rewards: each minus the mean of its group's other
    scorable rewards (NaN = unscorable: left out of the baseline, advantage 0); with `normalize`, the whole batch's
    advantages to mean 0 and std 1 (+1e-4)."""
    groups = rewards.view(-1, num_generations)
    std = losses.nan_std(groups, dim=1)
    counts = (~torch.isnan(groups)).sum(dim=1, keepdim=True)
    baselines = (torch.nansum(groups, dim=1, keepdim=True) - groups) / (counts - 1)
    advantages = rewards - baselines.view(-1)
    if normalize:
        advantages = (advantages - torch.nanmean(advantages)) / (losses.nan_std(advantages) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0), torch.isclose(std, torch.zeros_like(std))


class RLOOTrainer(GRPOTrainer):
    """RLOOTrainer(model, reward_funcs, args=RLOOConfig(...), train_dataset=..., processing_class=...,
    peft_config=None): GRPOTrainer's arguments without rollout_func (TRL's RLOOTrainer has none)."""

    loss_is_scaled_for_ga = False  # a mean over sequences: the Trainer divides it for accumulation, as TRL's
    always_old_logps = True  # the old policy's log-probs feed the KL penalty and the ratio, even on-policy

    def __init__(self, model, reward_funcs=None, args=None, **kwargs):
        for name in ("rollout_func", "tools", "environment_factory"):
            if kwargs.get(name) is not None:
                raise ValueError(f"RLOOTrainer has no {name} (TRL's RLOOTrainer neither): use GRPOTrainer for it.")
        args = args if args is not None else RLOOConfig(output_dir="rloo_output")
        if not isinstance(args, RLOOConfig):
            raise ValueError(f"RLOOTrainer needs an RLOOConfig; got {type(args).__name__}.")
        super().__init__(model, reward_funcs, args, **kwargs)

    def compute_advantages(self, rewards_per_func, old_logps, ref_logps, mask, mode):
        """The whole generation batch's RLOO advantages and is_std_zero; logs the KL (old - reference) at beta > 0."""
        args = self.args
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        rewards = (rewards_per_func * self.reward_weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        if args.reward_clip_range:
            rewards = rewards.clamp(min=args.reward_clip_range[0], max=args.reward_clip_range[1])
        if args.beta != 0.0:
            # The first-order estimate (old - reference), summed over each sequence and taken from its reward, as
            # RLOO's paper and TRL do (GRPO instead adds the k3 estimate to the per-token loss).
            per_token_kl = (old_logps - ref_logps) * mask
            rewards = rewards - args.beta * ranks.gather(per_token_kl.sum(-1)).to(rewards.device)
            stats = ranks.total(torch.stack([per_token_kl.sum(), mask.sum().float()]))
            self._metrics[mode]["kl"].append((stats[0] / stats[1].clamp(min=1.0)).item())
        return leave_one_out_advantages(rewards, args.num_generations, args.normalize_advantages)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("RLOOTrainer.compute_loss does not return outputs.")
        args, mode = self.args, "train" if self.model.training else "eval"
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"]
        per_token, entropies = generation.per_token_logps(
            model, input_ids, attention_mask, mask.size(1), args.temperature, True
        )
        # One ratio per sequence: the exponential of its summed token log-ratios.
        ratio = torch.exp((per_token * mask).sum(1) - (inputs["old_per_token_logps"] * mask).sum(1))
        advantages = inputs["advantages"]
        epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        clipped = torch.clamp(ratio, 1 - args.epsilon, 1 + epsilon_high)
        loss = -torch.min(ratio * advantages, clipped * advantages).mean()
        metrics = self._metrics[mode]
        metrics["entropy"].append(losses.masked_mean(entropies, mask))
        ratio = ratio.detach()
        low = ranks.gather(((ratio < 1 - args.epsilon) & (advantages < 0)).float())
        high = ranks.gather(((ratio > 1 + epsilon_high) & (advantages > 0)).float())
        region = ranks.gather(
            (((ratio < 1 - args.epsilon) & (advantages < 0)) | ((ratio > 1 + epsilon_high) & (advantages > 0))).float()
        )
        metrics["clip_ratio/low_mean"].append(low.nanmean().item())
        metrics["clip_ratio/low_min"].append(low.min().item())
        metrics["clip_ratio/high_mean"].append(high.nanmean().item())
        metrics["clip_ratio/high_max"].append(high.max().item())
        metrics["clip_ratio/region_mean"].append(region.nanmean().item())
        return loss
