"""The pre-training recipe (stage: pt): documents + EOS, concatenated into cutoff_len blocks, and a
causal LM trained on every token.

    config -> tokenizer, template -> tokenized blocks -> model (full/freeze/lora)
           -> Trainer.train() -> save -> evaluate (loss, perplexity)
"""

from __future__ import annotations

from lathe.llm.methods.meter import TokenMeterMixin
from lathe.llm.methods.optimizers import MethodOptimizerMixin
from lathe.llm.workflows.plan import make_plan, report_plan
from lathe.llm.workflows.setup import (
    checkpointing_for,
    evaluate_and_save,
    load_data,
    make_callbacks,
    resolve_resume_checkpoint,
    train_and_save,
    write_model_card,
)
from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.trainer import Trainer


class PretrainTrainer(TokenMeterMixin, MethodOptimizerMixin, Trainer):
    """The Trainer with the fine-tuning methods' optimizers (LoRA+)."""


class PretrainCollator:
    """Pad blocks to the longest in the batch; labels are the input ids, -100 on padding only.

    Padding is found by position (the attention mask), not by token id: the pad token is usually
    EOS, and masking by id (as transformers' DataCollatorForLanguageModeling does) would hide every
    document boundary from the loss.
    """

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = None):
        self.pad_id = tokenizer.pad_token_id
        self.right = tokenizer.padding_side != "left"
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: list[dict]) -> dict:
        import torch

        length = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = torch.full((len(features), length), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(features), length), dtype=torch.long)
        for row, feature in enumerate(features):
            ids = torch.as_tensor(feature["input_ids"], dtype=torch.long)
            span = slice(0, len(ids)) if self.right else slice(length - len(ids), length)
            input_ids[row, span] = ids
            attention[row, span] = 1
        labels = input_ids.masked_fill(attention == 0, IGNORE_INDEX)
        return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def run(config, dry_run: bool = False, callbacks: list | None = None) -> dict:
    """Run stage pt as configured; returns the metrics of what ran ({} for a dry run)."""
    from lathe.llm.model.loader import load_model
    from lathe.llm.workflows.outputs import set_stop_tokens
    from lathe.train.seed import set_seed

    model_args, training_args, finetuning_args = config.model, config.training, config.finetuning
    resume_from = resolve_resume_checkpoint(config)

    tokenizer, template, datasets = load_data(config, stage="pt")
    set_seed(training_args.seed)  # new weights (LoRA, train_from_scratch) are drawn while loading
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=training_args.do_train, meta=dry_run)
    checkpointing_for(model, training_args)

    plan = make_plan(config, datasets, model, resume_from)
    report_plan(config, plan)
    if dry_run:
        return {}

    set_stop_tokens(model, tokenizer, template)
    trainer = PretrainTrainer(
        model=model,
        args=training_args,
        data_collator=PretrainCollator(tokenizer),
        processing_class=tokenizer,
        train_dataset=datasets["train_dataset"],
        eval_dataset=datasets["eval_dataset"],
        callbacks=make_callbacks(config) + list(callbacks or []),
        finetuning_args=finetuning_args,
    )
    metrics = train_and_save(trainer, config, plan, resume_from, datasets["eval_dataset"])
    if training_args.do_eval:
        metrics.update(evaluate_and_save(trainer, with_perplexity=True))
    write_model_card(trainer, config)
    return metrics
