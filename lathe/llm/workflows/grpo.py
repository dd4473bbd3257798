"""The online RL recipe (stages grpo and rloo): TRL's GRPO on lathe's GRPOTrainer, or TRL's RLOO on its
RLOOTrainer (lathe.llm.rl), with the prompts of registered datasets rendered by the template and reward functions
named in the config.

    config -> tokenizer, template -> prompts (+ the rows' other columns) -> model (full/freeze/lora)
           -> reference (none at beta 0; the policy with adapters off under LoRA; else a frozen copy)
           -> sample, score, train -> save -> plot loss and reward
"""

from __future__ import annotations

import dataclasses
import os

from lathe.llm.workflows.plan import make_plan, report_plan
from lathe.llm.workflows.setup import (
    checkpointing_for,
    make_callbacks,
    resolve_resume_checkpoint,
    train_and_save,
    write_model_card,
)

PLOTTED = ("loss", "reward")  # lathe's plots: the loss and the mean reward per logged step


def reward_search_dirs(config) -> list[str]:
    """Where `module:function` reward names are imported from first: the config file's folder."""
    return [os.path.dirname(os.path.abspath(config.source))] if config.source else []


def run(config, dry_run: bool = False, callbacks: list | None = None) -> dict:
    """Run stage grpo (or rloo) as configured; returns the training metrics ({} for a dry run)."""
    from lathe.llm.config.grpo import grpo_config
    from lathe.llm.data.prompts import get_prompt_dataset
    from lathe.llm.model.loader import load_model, load_tokenizer
    from lathe.llm.rl import GRPOTrainer, RLOOTrainer
    from lathe.llm.templates import get_template_and_fix_tokenizer
    from lathe.llm.workflows.outputs import set_stop_tokens
    from lathe.train.seed import set_seed

    model_args, training_args, finetuning_args = config.model, config.training, config.finetuning
    resume_from = resolve_resume_checkpoint(config)
    tokenizer = load_tokenizer(config.model)
    template = get_template_and_fix_tokenizer(tokenizer, config.data)
    datasets = get_prompt_dataset(template, model_args, config.data, training_args, tokenizer)
    set_seed(training_args.seed)  # new weights (LoRA) are drawn while loading
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=training_args.do_train, meta=dry_run)
    checkpointing_for(model, training_args)
    args = grpo_config(training_args, finetuning_args)

    plan = make_plan(config, datasets, model, resume_from)
    plan_grpo(plan, config, args, datasets["train_dataset"], model)
    report_plan(config, plan)
    if dry_run:
        return {}

    set_stop_tokens(model, tokenizer, template)
    trainer_class, extra = (
        GRPOTrainer,
        {
            "rollout_func": finetuning_args.rollout_func,
            # Tools: rendered by the template when the config names one, else by the tokenizer's chat template (TRL's).
            "tools": finetuning_args.tools,
            "environment_factory": finetuning_args.environment_factory,
            "tool_format": config.data.tool_format,
            "template": template if config.data.template is not None else None,
        },
    )
    if finetuning_args.stage == "rloo":  # TRL's RLOOTrainer has no rollout_func, tools or environments
        trainer_class, extra = RLOOTrainer, {}
    trainer = trainer_class(
        model=model,
        reward_funcs=list(finetuning_args.reward_funcs),
        args=args,
        train_dataset=datasets["train_dataset"],
        processing_class=tokenizer,
        callbacks=make_callbacks(config) + list(callbacks or []),
        reward_search_dirs=reward_search_dirs(config),
        **extra,
    )
    metrics = train_and_save(trainer, config, plan, resume_from, None, train_keys=PLOTTED)
    write_model_card(trainer, config)
    return metrics


def plan_grpo(plan, config, args, train, model) -> None:
    """The plan's step count as GRPO's sampler yields rows (each prompt num_generations x num_iterations
    times) and its memory: the training step and the sampling of a generation batch (lathe.llm.memory.grpo)."""
    from lathe.llm.memory.fit import advice, available_memory
    from lathe.llm.memory.grpo import estimate_grpo_memory
    from lathe.llm.workflows.plan import memory_settings, world_size
    from lathe.train.batching import plan_training

    prompts = len(train)
    lengths = [len(ids) for ids in train["prompt_ids"]]
    prompt_len = min(max(lengths), args.max_prompt_length or max(lengths))
    plan.train_tokens, plan.trained_tokens, plan.cutoff_len, plan.truncation = sum(lengths), None, None, None
    plan.reference = reference_description(config)
    if not config.training.do_train:
        return
    per_generation = args.generation_batch_size // args.num_generations
    # The sampler yields each generation batch num_iterations x steps_per_generation times and the loader
    # reads steps_per_generation micro-batches at once: one micro-step per per_device_train_batch_size rows.
    processes = world_size(config)
    rows = (prompts // per_generation) * per_generation * args.num_generations * args.num_iterations
    batches = rows // (args.per_device_train_batch_size * processes)
    schedule = plan_training(args, batches, prompts, args.per_device_train_batch_size)
    plan.steps_per_epoch, plan.total_steps = schedule.updates_per_epoch, schedule.max_steps
    plan.epochs = plan.total_steps / plan.steps_per_epoch if plan.steps_per_epoch else 0.0
    tokens_only = train.rename_column("prompt_ids", "input_ids").select_columns(["input_ids"])
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    settings = dataclasses.replace(
        memory_settings(config, tokens_only, vocab),
        seq_len=-(-(prompt_len + args.max_completion_length) // 8) * 8,
        masked=True,
        chunk=None,  # GRPO's log-probs come from full-vocabulary logits
        reference_copy=args.beta != 0.0 and config.finetuning.finetuning_type not in ("lora", "oft"),
    )
    if settings.sharding is not None:  # GRPO's reference copy is whole on every process (not sharded as dpo's)
        settings = dataclasses.replace(settings, sharding=dataclasses.replace(settings.sharding, reference=False))
    available = available_memory(config.training.device)
    # Each of the N processes samples per_device_train_batch_size x steps_per_generation rows of the generation
    # batch. A generation_batch_size set in the config is shared by the N processes the run will have (the plan
    # may be made in one process: a dry run, or the launcher before torchrun starts the N).
    steps_per_generation = args.steps_per_generation
    if config.finetuning.generation_batch_size is not None:
        steps_per_generation = max(1, args.generation_batch_size // (args.per_device_train_batch_size * processes))
    plan.memory = estimate_grpo_memory(
        model,
        settings,
        available,
        steps_per_generation,
        prompt_len,
        args.max_completion_length,
        args.ds3_gather_for_generation,
    )
    if plan.memory is not None and not plan.memory.fits:
        plan.memory_advice = advice(plan.memory, model, settings)


def reference_description(config) -> str:
    finetuning = config.finetuning
    if finetuning.beta == 0.0:
        return "none (beta 0: no KL term)"
    if finetuning.finetuning_type in ("lora", "oft"):
        return f"the policy with its adapters off (beta {finetuning.beta}; no copy)"
    return f"a frozen copy of the initial model (beta {finetuning.beta})"
