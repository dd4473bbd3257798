"""The reward-model recipe (stage rm): a value head on the causal LM, trained so that the chosen answer
of each pair scores above the rejected one; evaluation reports accuracy, do_predict writes the scores.

    config -> tokenizer, template -> tokenized pairs -> model (full/freeze/lora) + value head
           -> RewardTrainer.train() -> save (weights or adapter + value_head.safetensors) -> evaluate -> predict
"""

from __future__ import annotations

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


def run(config, dry_run: bool = False, callbacks: list | None = None) -> dict:
    """Run stage rm as configured; returns the metrics of what ran ({} for a dry run)."""
    from lathe.llm.data.pairwise import PairwiseDataCollator
    from lathe.llm.model.loader import load_model
    from lathe.llm.model.value_head import ValueHeadModel, add_value_head
    from lathe.llm.preference.reward import RewardAccuracy, RewardTrainer
    from lathe.train.seed import set_seed

    model_args, training_args, finetuning_args = config.model, config.training, config.finetuning
    resume_from = resolve_resume_checkpoint(config)

    tokenizer, template, datasets = load_data(config, stage="rm")
    set_seed(training_args.seed)  # new weights (LoRA, then the value head) are drawn while loading
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=training_args.do_train, meta=dry_run)
    model = ValueHeadModel(model) if dry_run else add_value_head(model, model_args)
    checkpointing_for(model, training_args)

    plan = make_plan(config, datasets, model, resume_from)
    report_plan(config, plan)
    if dry_run:
        return {}

    trainer = RewardTrainer(
        model=model,
        args=training_args,
        data_collator=PairwiseDataCollator(tokenizer, pad_to_multiple_of=8),
        processing_class=tokenizer,
        train_dataset=datasets["train_dataset"],
        eval_dataset=datasets["eval_dataset"],
        compute_metrics=RewardAccuracy(),
        callbacks=make_callbacks(config) + list(callbacks or []),
        finetuning_args=finetuning_args,
    )
    metrics = train_and_save(
        trainer, config, plan, resume_from, datasets["eval_dataset"], eval_keys=("loss", "accuracy")
    )
    if training_args.do_eval:
        metrics.update(evaluate_and_save(trainer, with_perplexity=False))
    if training_args.do_predict:
        eval_dataset = datasets["eval_dataset"]
        if isinstance(eval_dataset, dict):
            raise ValueError("do_predict with eval_on_each_dataset is not supported yet: predict on one eval set.")
        results = trainer.predict(eval_dataset, metric_key_prefix="predict")
        trainer.log_metrics("predict", results.metrics)
        trainer.save_metrics("predict", results.metrics)
        trainer.save_predictions(results)
        metrics.update(results.metrics)
    write_model_card(trainer, config)
    return metrics
