"""The supervised fine-tuning recipe (stage: sft): conversations rendered by the template, the loss
on assistant tokens only, and optionally generation on the held-out prompts.

    config -> tokenizer, template -> tokenized conversations -> model (full/freeze/lora)
           -> Seq2SeqTrainer.train() -> save -> evaluate -> predict (generated_predictions.jsonl)
"""

from __future__ import annotations

from lathe.llm.methods.losses import LossVariantsMixin, load_reference_model
from lathe.llm.methods.meter import TokenMeterMixin
from lathe.llm.methods.optimizers import MethodOptimizerMixin
from lathe.llm.multimodal.saving import processor_callbacks
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
from lathe.train.seq2seq import Seq2SeqTrainer


class SFTTrainer(TokenMeterMixin, LossVariantsMixin, MethodOptimizerMixin, Seq2SeqTrainer):
    """Seq2SeqTrainer for decoder-only models: with predict_with_generate, the rows hold the prompt
    only and the labels the reference answer, so generation runs without labels (their length
    differs from the prompt's) and the prompt is blanked out of what generate() returns."""

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None, **gen_kwargs):
        if not self.args.predict_with_generate or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        labels = inputs.pop("labels", None)
        loss, generated, _ = super().prediction_step(
            model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs
        )
        if generated is not None:
            generated = generated.clone()
            generated[:, : inputs["input_ids"].size(-1)] = self.processing_class.pad_token_id
        return loss, generated, labels


def generation_kwargs(config, tokenizer, template) -> dict:
    """model.generate() settings: GeneratingArguments plus the template's stop tokens and the pad id."""
    kwargs = config.generating.generation_kwargs()
    kwargs["eos_token_id"] = template.get_stop_token_ids(tokenizer)
    kwargs["pad_token_id"] = tokenizer.pad_token_id
    return kwargs


def make_collator(config, tokenizer, model, media=None):
    """The collator sft trains with (LLaMA-Factory's settings: rows padded to a multiple of 8 when training); a
    vision-language model's adds the media tensors (lathe.llm.multimodal.collator)."""
    from lathe.llm.data.collator import SFTDataCollator

    data_args = config.data
    collator = SFTDataCollator(
        tokenizer=tokenizer,
        model=model,
        neat_packing=data_args.neat_packing,
        label_pad_token_id=IGNORE_INDEX if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id,
        pad_to_multiple_of=8 if config.training.do_train else None,
    )
    # LLaMA-Factory's sft collator casts every floating tensor to its compute dtype; lathe's is the dtype its frozen
    # weights load in (float32 without bf16 / fp16: model.loader.weights_dtype). Llama 4's image processor gives
    # bfloat16 pixel_values, which a float32 vision tower refuses
    compute_dtype = config.model.compute_dtype or "float32"
    generating = config.training.predict_with_generate
    return multimodal_collator(collator, model, media, generating=generating, compute_dtype=compute_dtype)


def multimodal_collator(collator, model, media, generating: bool = False, compute_dtype: str | None = None):
    """`collator` wrapped for a vision-language model run with a multimodal template; unchanged otherwise.
    `generating` (predict_with_generate): no position ids from the collator, generate() makes them;
    `compute_dtype`: the dtype the batch's floating tensors are cast to (None: left as the processor made them)."""
    from lathe.llm.multimodal.towers import is_vision_language

    if media is None or not is_vision_language(model):
        return collator
    from lathe.llm.multimodal.collator import MultimodalCollator

    return MultimodalCollator(collator, media.plugin, model, generating=generating, compute_dtype=compute_dtype)


def run(config, dry_run: bool = False, callbacks: list | None = None) -> dict:
    """Run stage sft as configured; returns the metrics of what ran ({} for a dry run)."""
    from lathe.llm.model.loader import load_model
    from lathe.llm.workflows.metrics import GenerationMetrics
    from lathe.llm.workflows.outputs import save_predictions, set_stop_tokens
    from lathe.train.seed import set_seed

    model_args, data_args, training_args, finetuning_args = (
        config.model,
        config.data,
        config.training,
        config.finetuning,
    )
    resume_from = resolve_resume_checkpoint(config)

    tokenizer, template, datasets = load_data(config, stage="sft")
    set_seed(training_args.seed)  # new weights (LoRA, train_from_scratch) are drawn while loading
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=training_args.do_train, meta=dry_run)
    checkpointing_for(model, training_args)
    if data_args.packing and datasets.get("media") is None:  # media rows keep the 4-D mask (multimodal/collator.py)
        from lathe.llm.model.packed_attention import use_packed_attention

        use_packed_attention(model)  # sdpa per packed example instead of over a block-diagonal mask

    plan = make_plan(config, datasets, model, resume_from)
    report_plan(config, plan)
    if dry_run:
        return {}

    set_stop_tokens(model, tokenizer, template)
    collator = make_collator(config, tokenizer, model, datasets.get("media"))
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        data_collator=collator,
        processing_class=tokenizer,
        train_dataset=datasets["train_dataset"],
        eval_dataset=datasets["eval_dataset"],
        compute_metrics=GenerationMetrics(tokenizer, config.generating.skip_special_tokens)
        if training_args.predict_with_generate
        else None,
        callbacks=make_callbacks(config) + processor_callbacks(datasets.get("media"), model) + list(callbacks or []),
        finetuning_args=finetuning_args,
        ref_model=load_reference_model(tokenizer, model_args, finetuning_args),
    )
    metrics = train_and_save(trainer, config, plan, resume_from, datasets["eval_dataset"])

    gen_kwargs = generation_kwargs(config, tokenizer, template) if training_args.predict_with_generate else {}
    if training_args.predict_with_generate:
        tokenizer.padding_side = "left"  # generation continues the prompt: pad on the left
    if training_args.do_eval:
        metrics.update(evaluate_and_save(trainer, with_perplexity=False, **gen_kwargs))
    if training_args.do_predict:
        eval_dataset = datasets["eval_dataset"]
        if isinstance(eval_dataset, dict):
            raise ValueError("do_predict with eval_on_each_dataset is not supported yet: predict on one eval set.")
        results = trainer.predict(eval_dataset, metric_key_prefix="predict", **gen_kwargs)
        trainer.log_metrics("predict", results.metrics)
        trainer.save_metrics("predict", results.metrics)
        if trainer.is_world_process_zero():
            path = save_predictions(
                training_args.output_dir, eval_dataset, results, tokenizer, config.generating.skip_special_tokens
            )
            # The run's headline number as its last line (the metrics block lists it among timings).
            print(
                f"Exact match: {results.metrics['predict_exact_match']:.1f}% of {len(eval_dataset)} "
                f"held-out examples (predictions in {path})",
                flush=True,
            )
        metrics.update(results.metrics)
    write_model_card(trainer, config)
    return metrics
