"""What LLaMA-Factory's optimizer and loss keys change in the Trainer, through its documented override points:
create_optimizer (GaLore, APOLLO, BAdam, Adam-mini, Muon), compute_loss_func (DFT, EAFT) and compute_loss
(ASFT, which also runs a frozen reference model). Mixed into the recipes' trainers (pt and sft)."""
from __future__ import annotations

import copy

import torch

__all__ = ["MethodsMixin", "load_reference_model"]


class MethodsMixin:
    """Takes `finetuning_args` (and, for ASFT, `ref_model`) besides the Trainer's own arguments."""

    def __init__(self, *args, finetuning_args=None, ref_model=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.finetuning_args = finetuning_args
        self.ref_model = ref_model
        if finetuning_args is None:
            return
        from lathe.llm.workflows.losses import asft_loss, loss_function_for

        loss_function = loss_function_for(finetuning_args)
        if finetuning_args.use_asft_loss:
            if ref_model is None:
                raise ValueError("use_asft_loss needs the reference model (ref_model).")
            # compute_loss below calls it; being set, it also tells the step maths not to divide the loss by
            # the accumulation steps (LLaMA-Factory's ASFT loss is a per-micro-batch mean, summed).
            loss_function = asft_loss
            self.ref_model = ref_model.to(self.args.device)
        if loss_function is not None:
            self.compute_loss_func = loss_function

    def create_optimizer(self, model=None):
        if self.optimizer is None and self.finetuning_args is not None:
            from lathe.llm.workflows.optimizers import create_custom_optimizer

            self.optimizer = create_custom_optimizer(model or self.model, self.args, self.finetuning_args)
        return super().create_optimizer(model)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.ref_model is None:  # evaluation too computes the ASFT loss, as in LLaMA-Factory
            return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        with torch.no_grad():  # the reference sees what LLaMA-Factory gives it: ids and mask, no positions
            reference = self.ref_model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask")).logits
        outputs = model(**inputs)
        loss = self.compute_loss_func(outputs, inputs["labels"], reference, alpha=self.finetuning_args.asft_alpha)
        return (loss, outputs) if return_outputs else loss


def load_reference_model(tokenizer, model_args, finetuning_args):
    """ASFT's reference: the starting model, frozen, in the training's compute dtype (None when not needed)."""
    if not finetuning_args.use_asft_loss:
        return None
    from lathe.llm.config import FinetuningArguments
    from lathe.llm.model.loader import load_model

    reference_args = copy.copy(model_args)
    reference_args.infer_dtype = model_args.compute_dtype or "float32"
    return load_model(tokenizer, reference_args, FinetuningArguments(finetuning_type="full"), is_trainable=False)
