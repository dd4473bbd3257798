"""The preference recipes (stage dpo and stage kto): pairs (dpo) or tagged answers (kto) against a
reference model, on lathe's own DPOTrainer / KTOTrainer.

    config -> tokenizer, template -> tokenized pairs / tagged answers -> model (full/freeze/lora)
           -> reference (frozen copy, the adapter-less policy, or none) -> train -> save -> evaluate
"""

from __future__ import annotations

from lathe.llm.multimodal.saving import processor_callbacks
from lathe.llm.workflows.plan import make_plan, report_plan
from lathe.llm.workflows.setup import (
    checkpointing_for,
    load_data,
    make_callbacks,
    resolve_resume_checkpoint,
    train_and_save,
    write_model_card,
)
from lathe.train.data.labels import IGNORE_INDEX

# What LLaMA-Factory plots besides the loss, per stage.
PLOTTED = {"dpo": ("loss", "rewards/accuracies"), "kto": ("loss", "rewards/chosen")}


def make_reference(model, tokenizer, config):
    """The reference model: the model itself when only evaluating (rewards are then meaningless and
    left out of the results, as in LLaMA-Factory), else create_reference_model's choice."""
    from lathe.llm.preference.reference import create_reference_model, needs_reference

    finetuning = config.finetuning
    if needs_reference(finetuning) and finetuning.ref_model is None and not config.training.do_train:
        return model
    return create_reference_model(tokenizer, config.model, finetuning)


def run(config, dry_run: bool = False, callbacks: list | None = None) -> dict:
    """Run stage dpo or kto as configured; returns the metrics of what ran ({} for a dry run)."""
    from lathe.llm.model.loader import load_model
    from lathe.llm.workflows.outputs import set_stop_tokens
    from lathe.train.seed import set_seed

    model_args, training_args, finetuning_args = config.model, config.training, config.finetuning
    stage = finetuning_args.stage
    resume_from = resolve_resume_checkpoint(config)

    tokenizer, template, datasets = load_data(config, stage=stage)
    set_seed(training_args.seed)  # new weights (LoRA) are drawn while loading
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=training_args.do_train, meta=dry_run)
    checkpointing_for(model, training_args)

    plan = make_plan(config, datasets, model, resume_from)
    report_plan(config, plan)
    if dry_run:
        return {}

    set_stop_tokens(model, tokenizer, template)
    reference = make_reference(model, tokenizer, config)
    trainer = _make_trainer(config, model, reference, tokenizer, datasets, callbacks)
    metrics = train_and_save(trainer, config, plan, resume_from, datasets["eval_dataset"], train_keys=PLOTTED[stage])
    if training_args.do_eval:
        results = trainer.evaluate(metric_key_prefix="eval")
        if reference is model:  # compared with itself: every reward is 0
            results = {key: value for key, value in results.items() if "rewards" not in key}
        trainer.log_metrics("eval", results)
        trainer.save_metrics("eval", results)
        metrics.update(results)
    write_model_card(trainer, config)
    return metrics


def _make_trainer(config, model, reference, tokenizer, datasets, callbacks):
    from lathe.llm.data.feedback import KTODataCollator
    from lathe.llm.data.pairwise import PairwiseDataCollator
    from lathe.llm.preference.dpo import DPOTrainer
    from lathe.llm.preference.kto import KTOTrainer

    dpo = config.finetuning.stage == "dpo"
    label_pad = IGNORE_INDEX if config.data.ignore_pad_token_for_loss else tokenizer.pad_token_id
    collator = (PairwiseDataCollator if dpo else KTODataCollator)(
        tokenizer, pad_to_multiple_of=8, label_pad_token_id=label_pad
    )
    from lathe.llm.workflows.sft import multimodal_collator

    collator.pad = multimodal_collator(collator.pad, model, datasets.get("media"))  # a VL model: media tensors
    return (DPOTrainer if dpo else KTOTrainer)(
        model=model,
        ref_model=reference,
        finetuning_args=config.finetuning,
        args=config.training,
        data_collator=collator,
        processing_class=tokenizer,
        train_dataset=datasets["train_dataset"],
        eval_dataset=datasets["eval_dataset"],
        callbacks=make_callbacks(config) + processor_callbacks(datasets.get("media"), model) + list(callbacks or []),
    )
