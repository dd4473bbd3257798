"""KTOTrainer (stage kto): each answer's log-ratio to the reference pushed above (desirable) or below
(undesirable) the batch's KL estimate, which comes from the mismatched pairs (each prompt with another
row's answer, scored without gradients). Logs rewards/*, logps/*, logits/* per side (sums over the
window divided by the counts, as TRL and LLaMA-Factory do), rewards/margins and kl."""

from __future__ import annotations

import torch

from lathe.llm.preference import losses
from lathe.llm.preference.logprobs import forward_log_probs
from lathe.llm.preference.trainer import PreferenceTrainer, all_reduce, no_grad_context

SIDES = ("chosen", "rejected")
SUMMED = ("rewards", "logps", "logits")
PER_ROW_INPUTS = ("token_type_ids", "cross_attention_mask", "position_ids")  # the KL rows' own (prefix kl_)
MEDIA_INPUTS = ("pixel_values", "image_sizes", "image_grid_thw", "aspect_ratio_ids", "aspect_ratio_mask")


class KTOTrainer(PreferenceTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.desirable_weight = self.finetuning_args.kto_chosen_weight
        self.undesirable_weight = self.finetuning_args.kto_rejected_weight

    def _log_probs(self, model, batch: dict, prefix: str = ""):
        """(logits, summed log-probs, mean token log-probs) of the target rows, or of the KL rows (prefix kl_)."""
        inputs = {"input_ids": batch[f"{prefix}input_ids"], "attention_mask": batch[f"{prefix}attention_mask"]}
        # a vision-language batch: the target rows' media tensors serve both forwards, as in LLaMA-Factory; each
        # side's mrope positions are the collator's (transformers 5.23 no longer derives them without token types)
        inputs.update({key: batch[key] for key in MEDIA_INPUTS if key in batch})
        inputs.update({key: batch[prefix + key] for key in PER_ROW_INPUTS if prefix + key in batch})
        logps, lengths, logits = forward_log_probs(self, model, inputs, batch[f"{prefix}labels"])
        return logits, logps, logps / lengths

    def split_forward(self, model, batch: dict, kl_model=None) -> dict[str, torch.Tensor]:
        """The target rows split by tag, and the KL rows' log-probs (always without gradients)."""
        logits, logps, averaged = self._log_probs(model, batch)
        with torch.no_grad():
            _, kl_logps, _ = self._log_probs(kl_model if kl_model is not None else model, batch, prefix="kl_")
        tags = batch["kto_tags"]
        if len(logps) != len(tags):
            raise ValueError(f"{len(logps)} sequences but {len(tags)} kto_tags in the batch.")
        return {
            "chosen_logps": logps[tags],
            "rejected_logps": logps[~tags],
            "chosen_logits": logits.rows(tags),
            "rejected_logits": logits.rows(~tags),
            "kl_logps": kl_logps,
            "chosen_logps_avg": averaged[tags],
        }

    def reference_log_probs(self, batch: dict) -> dict[str, torch.Tensor]:
        module, context = self.reference_module()
        with no_grad_context(context):
            return self.split_forward(module, batch)

    def batch_loss_and_metrics(self, model, batch: dict, split: str):
        # The policy's KL rows need no gradient: they go through the unwrapped model.
        policy = self.split_forward(model, batch, kl_model=self.model)
        reference = self.reference_log_probs(batch)
        kl = losses.kto_kl(policy["kl_logps"], reference["kl_logps"], lambda value: all_reduce(value, mean=True))
        chosen_logratios = policy["chosen_logps"] - reference["chosen_logps"]
        rejected_logratios = policy["rejected_logps"] - reference["rejected_logps"]
        values = losses.kto_loss(
            chosen_logratios, rejected_logratios, kl, self.beta, self.desirable_weight, self.undesirable_weight
        )
        loss = values.nanmean()
        chosen_count, rejected_count = len(policy["chosen_logps"]), len(policy["rejected_logps"])
        if self.ftx_gamma > 1e-6 and chosen_count > 0:
            # The SFT term on the desirable answers, rescaled as LLaMA-Factory does (x batch / desirable).
            loss = loss + self.ftx_gamma * (-policy["chosen_logps_avg"]).nanmean() / chosen_count * len(batch["labels"])
        rewards = {"chosen": self.beta * chosen_logratios.detach(), "rejected": self.beta * rejected_logratios.detach()}
        metrics = {}
        for side, count in zip(SIDES, (chosen_count, rejected_count)):
            metrics[f"rewards/{side}_sum"] = rewards[side].nansum()
            metrics[f"logps/{side}_sum"] = policy[f"{side}_logps"].detach().nansum()
            metrics[f"logits/{side}_sum"] = policy[f"{side}_logits"].nansum().detach()
            metrics[f"count/{side}"] = torch.tensor(float(count), device=loss.device)
        metrics["kl"] = kl
        return loss, metrics

    def combine_stored_metrics(self, split: str) -> dict[str, float]:
        """Sums and counts over the window and the processes -> per-side means; kl summed over the
        window's micro-batches (LLaMA-Factory's value: every micro-batch's kl, already averaged over
        the processes, added up)."""
        stored = self.take_stored_metrics(split)
        if not stored:
            return {}
        sums = {key: torch.stack([value.float() for value in values]).sum() for key, values in stored.items()}
        keys = [key for key in sums if key != "kl"]
        totals = dict(zip(keys, all_reduce(torch.stack([sums[key] for key in keys]), mean=False).tolist()))
        prefix = "eval_" if split == "eval" else ""
        logs = {}
        for side in SIDES:
            if totals[f"count/{side}"] > 0:
                for name in SUMMED:
                    logs[f"{prefix}{name}/{side}"] = totals[f"{name}/{side}_sum"] / totals[f"count/{side}"]
        if f"{prefix}rewards/chosen" in logs and f"{prefix}rewards/rejected" in logs:
            logs[f"{prefix}rewards/margins"] = logs[f"{prefix}rewards/chosen"] - logs[f"{prefix}rewards/rejected"]
        logs["kl"] = sums["kl"].item()
        return logs
