"""What the dpo and kto trainers share on top of lathe.train.Trainer: the reference model (a frozen copy,
or the policy with its adapter off), dropout off, the loss divided by gradient accumulation only, and the
per-micro-batch metrics (rewards/*, logps/*, ...) that are logged with the loss, as TRL logs them.

Override points used: compute_loss, prediction_step and log (each subclass says how its metrics are
combined over a logging window and over processes)."""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch

from lathe.llm.methods.meter import TokenMeterMixin
from lathe.llm.methods.optimizers import MethodOptimizerMixin
from lathe.llm.model.frozen import disable_dropout, frozen
from lathe.llm.preference.reference import reference_context, shard_reference_like_policy
from lathe.train import runtime
from lathe.train.parallel import distributed, fsdp
from lathe.train.trainer import Trainer


class PreferenceTrainer(TokenMeterMixin, MethodOptimizerMixin, Trainer):
    """Trainer(model, args, ..., ref_model=..., finetuning_args=...). `ref_model` None with a LoRA
    policy means: the policy with its adapter switched off; `ref_model is model` (evaluating without
    training) compares the model with itself."""

    def __init__(self, model=None, args=None, ref_model=None, finetuning_args=None, **kwargs):
        if finetuning_args is None:
            raise ValueError(
                f"{type(self).__name__} needs finetuning_args (pref_beta, pref_loss, ...: lathe.llm.config.train.FinetuningArguments)."
            )
        disable_dropout(model)
        if ref_model is not None and ref_model is not model:
            disable_dropout(ref_model)
        super().__init__(model=model, args=args, **kwargs)
        self.finetuning_args = finetuning_args
        self.beta = finetuning_args.pref_beta
        self.ftx_gamma = finetuning_args.pref_ftx
        # The preference loss is a mean over pairs: divided by gradient accumulation, never by a token count.
        self.model_accepts_loss_kwargs = False
        if ref_model is not None and ref_model is not model:
            ref_model = frozen(ref_model).to(self.args.device)
        self.ref_model = ref_model
        self._stored_metrics: dict[str, dict[str, list]] = {"train": defaultdict(list), "eval": defaultdict(list)}

    # ----- forward passes without gradients -----

    def reference_module(self):
        """(the module computing reference log-probs, the context to run it in). The frozen copy is
        sharded like the policy on the first call under FSDP2."""
        reference = self.ref_model
        if (
            reference is not None
            and reference is not self.model
            and fsdp.is_sharded(self.model)
            and not fsdp.is_sharded(reference)
        ):
            self.ref_model = reference = shard_reference_like_policy(reference, self.args)
        module, context = reference_context(self.model, reference)
        return (module if module is not None else self.model), context

    # ----- metrics -----

    def store_metrics(self, metrics: dict[str, torch.Tensor], split: str) -> None:
        """Keep one micro-batch's metrics (detached 0-dim tensors: no device sync per step) until the next log."""
        for key, value in metrics.items():
            self._stored_metrics[split][key].append(value)

    def take_stored_metrics(self, split: str) -> dict[str, list]:
        stored = self._stored_metrics[split]
        self._stored_metrics[split] = defaultdict(list)
        return stored

    def combine_stored_metrics(self, split: str) -> dict[str, float]:
        """The logged values of a window's stored metrics; every process calls this at every log."""
        raise NotImplementedError

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds the stored metrics of the window (training logs have "loss", evaluation logs "eval_loss")."""
        logs.update(self.combine_stored_metrics("train" if "loss" in logs else "eval"))
        super().log(logs, start_time)

    # ----- evaluation -----

    def batch_loss_and_metrics(self, model, inputs, split: str):
        raise NotImplementedError

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, metrics = self.batch_loss_and_metrics(model, inputs, "train")
        self.store_metrics(metrics, "train")
        return (loss, metrics) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None):
        """The loss (and the mean chosen / rejected logits, as TRL returns them) of an evaluation batch;
        the metrics are stored for the evaluation's log."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), runtime.autocast_context(self.args, self._autocast_dtype):
            loss, metrics = self.batch_loss_and_metrics(model, inputs, "eval")
        self.store_metrics(metrics, "eval")
        if prediction_loss_only:
            return loss.detach(), None, None
        logits = torch.stack(
            [metrics[key].float() for key in ("eval_logits/chosen", "eval_logits/rejected") if key in metrics]
        )
        return loss.detach(), logits, torch.zeros(logits.shape[0], device=logits.device)


def stack_means(values: list[torch.Tensor]) -> torch.Tensor:
    """The mean of a window's values, as TRL averages its stored floats (float32)."""
    return torch.stack([value.detach().float() for value in values]).mean()


def all_reduce(tensor: torch.Tensor, mean: bool) -> torch.Tensor:
    """Sum (or mean) over the processes; the tensor itself when there is one process."""
    if not distributed.is_distributed():
        return tensor
    import torch.distributed as dist

    tensor = tensor.clone()
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor / dist.get_world_size() if mean else tensor


def no_grad_context(context):
    """The reference forward: no gradients, inside `context` (e.g. the adapter switched off)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.no_grad())
    stack.enter_context(context)
    return stack
