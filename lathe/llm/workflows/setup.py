"""What every recipe does around the Trainer: decide where a run starts (LLaMA-Factory's output_dir
rules), the callbacks it adds, and what it saves when training ends. One home, so pt and sft cannot drift."""

from __future__ import annotations

import logging
import math
import os

from lathe.llm.memory.fit import start_batch_from_plan
from lathe.llm.methods.meter import summary_lines
from lathe.llm.workflows.outputs import TrainerLogCallback, plot_loss, save_generation_config
from lathe.llm.workflows.progress import use_postfix_bar
from lathe.llm.workflows.rerun import check_same_model, warn_about_changed_keys
from lathe.llm.workflows.run_config import write_run_config

__all__ = [
    "resolve_resume_checkpoint",
    "make_callbacks",
    "finish_training",
    "evaluate_and_save",
    "write_run_config",
    "write_model_card",
]

logger = logging.getLogger(__name__)

# Files that mean "a finished model is already here" (LLaMA-Factory refuses to train over them).
MODEL_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "adapter_model.bin",
)


def resolve_resume_checkpoint(config) -> str | None:
    """The checkpoint this run resumes from, as LLaMA-Factory decides it.

    resume_from_checkpoint wins when set. Otherwise, training into an existing output_dir resumes
    from its last complete checkpoint, unless overwrite_output_dir; a finished model there without
    checkpoints is an error rather than silently overwritten.
    """
    training = config.training
    explicit = training.resume_from_checkpoint
    if explicit not in (None, False, ""):
        check_same_model(config, explicit)
        warn_about_changed_keys(config, explicit)
        return explicit
    if not training.do_train or not os.path.isdir(training.output_dir) or training.overwrite_output_dir:
        return None
    from lathe.train.checkpoints.layout import get_last_checkpoint

    last = get_last_checkpoint(training.output_dir)
    if last is None and any(os.path.isfile(os.path.join(training.output_dir, name)) for name in MODEL_FILES):
        raise ValueError(
            f"output_dir {training.output_dir!r} already holds a trained model and no checkpoint to resume: "
            "set overwrite_output_dir: true, or choose another output_dir."
        )
    if last is not None:
        logger.info("Resuming training from %s (set overwrite_output_dir: true to start over).", last)
        check_same_model(config, last)
        warn_about_changed_keys(config, last)
    return last


def checkpointing_for(model, training_args) -> None:
    """Keep activation checkpointing only for a model that supports it (LLaMA-Factory warns and
    trains without it; transformers would raise deep inside gradient_checkpointing_enable)."""
    if training_args.gradient_checkpointing and not getattr(model, "supports_gradient_checkpointing", False):
        logger.warning("%s does not support gradient checkpointing: training without it.", type(model).__name__)
        training_args.activation_checkpointing = training_args.gradient_checkpointing = False


def make_callbacks(config) -> list:
    """trainer_log.jsonl always; early stopping with early_stopping_steps; the PiSSA conversion with pissa_convert."""
    callbacks = [TrainerLogCallback()]
    if config.finetuning.pissa_convert:
        from lathe.llm.workflows.pissa import PissaConvertCallback

        callbacks.append(PissaConvertCallback())
    if config.finetuning.early_stopping_steps is not None:
        from lathe.train.callbacks.flow import EarlyStoppingCallback

        callbacks.append(EarlyStoppingCallback(early_stopping_patience=config.finetuning.early_stopping_steps))
    return callbacks


def finish_training(
    trainer, config, train_result, eval_dataset, train_keys=("loss",), eval_keys=("loss",), plan=None
) -> None:
    """After train(): weights or adapter + tokenizer (save_model), generation_config.json with the
    stop tokens, train_results.json / all_results.json, trainer_state.json, and the plots of
    `train_keys` and of the evaluation's `eval_keys` (LLaMA-Factory's choice per stage). Below the
    train metrics, what the run measured (tokens/s, peak memory beside the plan's: workflows/meter.py)."""
    trainer.save_model()
    if trainer.is_world_process_zero() and config.finetuning.stage != "rm":  # a reward model does not generate
        save_generation_config(trainer.model, config.training.output_dir)
    trainer.log_metrics("train", train_result.metrics)
    if hasattr(trainer, "tokens_trained"):
        tokens = trainer.tokens_trained()  # on every rank: the count is summed over them
        if trainer.is_world_process_zero():
            memory = getattr(plan, "memory", None)
            lines = summary_lines(
                tokens, train_result.metrics["train_runtime"], getattr(memory, "peak", None), trainer.args.device
            )
            print("\n".join(lines), flush=True)
    trainer.save_metrics("train", train_result.metrics)
    trainer.save_state()
    if trainer.is_world_process_zero() and config.finetuning.plot_loss:
        keys = list(train_keys)
        if isinstance(eval_dataset, dict):  # eval_on_each_dataset: one curve per dataset
            keys += [f"eval_{name}_{key}" for name in eval_dataset for key in eval_keys]
        elif eval_dataset is not None:
            keys += [f"eval_{key}" for key in eval_keys]
        plot_loss(config.training.output_dir, keys=tuple(keys))


def evaluate_and_save(trainer, with_perplexity: bool, **gen_kwargs) -> dict:
    """evaluate() -> eval_results.json (and all_results.json); perplexity = exp(eval_loss) for pt."""
    metrics = trainer.evaluate(metric_key_prefix="eval", **gen_kwargs)
    if with_perplexity and "eval_loss" in metrics:
        try:
            metrics["eval_perplexity"] = math.exp(metrics["eval_loss"])
        except OverflowError:
            metrics["eval_perplexity"] = float("inf")
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


def load_data(config, stage: str):
    """(tokenizer, template, datasets) for a stage. The tokenizer and template come first: the template may add
    stop tokens the model must have rows for, and the data is tokenized with both."""
    from lathe.llm.data.pipeline import get_dataset
    from lathe.llm.model.loader import load_tokenizer
    from lathe.llm.multimodal.encode import MediaEncoder
    from lathe.llm.templates import get_template_and_fix_tokenizer

    tokenizer = load_tokenizer(config.model)
    template = get_template_and_fix_tokenizer(tokenizer, config.data)
    media = MediaEncoder.for_run(template, tokenizer, config.model)
    datasets = get_dataset(
        template, config.model, config.data, config.training, stage=stage, tokenizer=tokenizer, media=media
    )
    datasets["media"] = media
    return tokenizer, template, datasets


def train_and_save(trainer, config, plan, resume_from: str | None, eval_dataset, **finish_keys) -> dict:
    """Start at the plan's batch size, and with do_train write the run's config, train (resuming from
    resume_from), then save the model, the state, the logs and the loss plots; returns the training metrics
    ({} without do_train). finish_keys are finish_training's train_keys / eval_keys (the plotted keys)."""
    start_batch_from_plan(trainer, plan.memory)
    if not config.training.do_train:
        return {}
    write_run_config(config, resume_from)
    use_postfix_bar(trainer)  # on a terminal: the latest loss in the bar, not a dict line per log
    result = trainer.train(resume_from_checkpoint=resume_from)
    finish_training(trainer, config, result, eval_dataset, plan=plan, **finish_keys)
    return dict(result.metrics)


def write_model_card(trainer, config) -> None:
    """output_dir/README.md, the model card LLaMA-Factory writes last in every stage (do_train only): the
    Trainer's card with license "other", task text-generation, the base model, the dataset names and the
    tags llama-factory and the finetuning type (merged into PEFT's adapter card for LoRA). dpo and kto
    get the same card: LLaMA-Factory calls transformers' create_model_card there too, not TRL's."""
    if not config.training.do_train:
        return
    tags = ["llama-factory", config.finetuning.finetuning_type]
    for key, tag in (("use_unsloth", "unsloth"), ("use_kt", "kt-kernel")):
        if getattr(config.model, key, False):
            tags.append(tag)
    kwargs = {"tasks": "text-generation", "finetuned_from": config.model.model_name_or_path, "tags": tags}
    if config.data.dataset is not None:
        names = config.data.dataset
        kwargs["dataset"] = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    trainer.create_model_card(license="other", **kwargs)
