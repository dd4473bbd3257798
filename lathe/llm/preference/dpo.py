"""DPOTrainer (stage dpo): chosen and rejected answers in one forward pass, their log-probs compared with
the reference model's (sigmoid, hinge, ipo, optionally mixed with BCO) or with each other (orpo, simpo),
plus the SFT term of pref_ftx. Logs TRL's metrics under TRL's names: rewards/chosen, rewards/rejected,
rewards/accuracies, rewards/margins, logps/chosen, logps/rejected, logits/chosen, logits/rejected (and
sft_loss, odds_ratio_loss for orpo), averaged over the logging window and the processes."""

from __future__ import annotations

import torch

from lathe.llm.preference import losses
from lathe.llm.preference.logprobs import forward_log_probs
from lathe.llm.preference.trainer import PreferenceTrainer, all_reduce, no_grad_context, stack_means
from lathe.train.callbacks.events import TrainerCallback
from lathe.train.parallel import distributed
from lathe.train.state import ExportableState


class BCORunningMean(TrainerCallback, ExportableState):
    """The running mean of the rewards that BCO compares with: state across steps, so it is saved in
    every checkpoint and restored on resume (whatever restore_callback_states_from_checkpoint says:
    the loss depends on it)."""

    def __init__(self, mean: float = 0.0, count: float = 1e-24):
        self.running = losses.RunningMean(mean, count)

    def state(self) -> dict:
        return {"args": {"mean": self.running.mean, "count": self.running.count}, "attributes": {}}

    def on_train_begin(self, args, state, control, **kwargs):
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if isinstance(saved, dict):  # the checkpoint's value on resume, this object's own on a fresh run
            self.running = losses.RunningMean(**saved["args"])


class DPOTrainer(PreferenceTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = self.finetuning_args
        self.loss_type = settings.pref_loss
        self.use_reference = settings.use_ref_model
        self.label_smoothing = settings.dpo_label_smoothing
        self.simpo_gamma = settings.simpo_gamma
        self.bco_weight = settings.pref_bco_weight
        self.ld_alpha = settings.ld_alpha
        self.bco_mean = None
        if self.bco_weight > 1e-6:
            self.bco_mean = BCORunningMean()
            self.add_callback(self.bco_mean)

    def concatenated_forward(self, model, batch: dict, is_reference: bool = False) -> dict[str, torch.Tensor]:
        """Log-probs (summed, or per token for ipo/orpo/simpo) and logits of the chosen half and the
        rejected half of the batch, from one forward pass."""
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        logps, lengths, logits = forward_log_probs(
            self, model, inputs, batch["labels"], ld_alpha=None if is_reference else self.ld_alpha
        )
        if self.loss_type in losses.AVERAGED_LOSSES:
            logps = logps / lengths
        pairs = batch["input_ids"].size(0) // 2
        chosen_logps, rejected_logps = logps.split(pairs, dim=0)
        chosen_logits, rejected_logits = logits.split(pairs)
        chosen_lengths = lengths[:pairs]
        averaged = chosen_logps if self.loss_type in losses.AVERAGED_LOSSES else chosen_logps / chosen_lengths
        return {
            "chosen_logps": chosen_logps,
            "rejected_logps": rejected_logps,
            "chosen_logits": chosen_logits,
            "rejected_logits": rejected_logits,
            "chosen_logps_avg": averaged,
        }

    def reference_log_probs(self, batch: dict):
        """(chosen, rejected) log-probs of the reference model; (None, None) for orpo and simpo."""
        if not self.use_reference:
            return None, None
        module, context = self.reference_module()
        with no_grad_context(context):
            output = self.concatenated_forward(module, batch, is_reference=True)
        return output["chosen_logps"], output["rejected_logps"]

    def preference_losses(self, policy: dict, ref_chosen, ref_rejected, update_bco: bool):
        chosen, rejected = policy["chosen_logps"], policy["rejected_logps"]
        if not self.use_reference:
            return losses.reference_free_loss(chosen, rejected, self.loss_type, self.beta, self.simpo_gamma)
        values, chosen_rewards, rejected_rewards = losses.dpo_loss(
            chosen, rejected, ref_chosen, ref_rejected, self.loss_type, self.beta, self.label_smoothing
        )
        if self.bco_mean is not None:
            if update_bco:  # evaluation reads the running mean without moving it
                batch_mean = all_reduce(torch.cat((chosen_rewards, rejected_rewards), 0).mean().detach(), mean=True)
                self.bco_mean.running.update(
                    batch_mean, distributed.world_size() if distributed.is_distributed() else 1
                )
            bco = losses.bco_loss(chosen, rejected, ref_chosen, ref_rejected, self.beta, self.bco_mean.running.mean)
            values = losses.mix_bco(values, bco, self.bco_weight)
        return values, chosen_rewards, rejected_rewards

    def batch_loss_and_metrics(self, model, batch: dict, split: str):
        policy = self.concatenated_forward(model, batch)
        ref_chosen, ref_rejected = self.reference_log_probs(batch)
        values, chosen_rewards, rejected_rewards = self.preference_losses(
            policy, ref_chosen, ref_rejected, split == "train"
        )
        sft_loss = -policy["chosen_logps_avg"]
        preference_only = values
        if self.ftx_gamma > 1e-6:
            values = values + self.ftx_gamma * sft_loss
        prefix = "eval_" if split == "eval" else ""
        metrics = {
            "rewards/chosen": chosen_rewards.mean(),
            "rewards/rejected": rejected_rewards.mean(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
            "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
            "logps/chosen": policy["chosen_logps"].mean(),
            "logps/rejected": policy["rejected_logps"].mean(),
            "logits/chosen": policy["chosen_logits"].mean(),
            "logits/rejected": policy["rejected_logits"].mean(),
        }
        if self.loss_type == "orpo":
            metrics["sft_loss"] = sft_loss.mean()
            # The odds-ratio term alone. LLaMA-Factory computes it after adding pref_ftx's term, so with
            # pref_ftx > 0 its value also holds pref_ftx x sft_loss / beta; with pref_ftx 0 they agree.
            metrics["odds_ratio_loss"] = ((preference_only - sft_loss) / self.beta).mean()
        return values.mean(), {f"{prefix}{key}": value.detach() for key, value in metrics.items()}

    def combine_stored_metrics(self, split: str) -> dict[str, float]:
        """Each metric's mean over the window's micro-batches, then over the processes (TRL/LLaMA-Factory)."""
        stored = self.take_stored_metrics(split)
        if not stored:
            return {}
        keys = list(stored)
        means = all_reduce(torch.stack([stack_means(stored[key]) for key in keys]).to(self.args.device), mean=True)
        return dict(zip(keys, means.tolist()))
