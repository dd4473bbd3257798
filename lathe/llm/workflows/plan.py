"""What `lathe train` prints before it starts: the configuration (config_dump.py: the keys set, and what
lathe resolved otherwise than LLaMA-Factory) and the plan — examples, tokens, steps, when it logs/evaluates/saves, trainable parameters."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

from lathe.llm.config.methods import describe_method
from lathe.llm.memory.preference import PREFERENCE_STAGES
from lathe.llm.workflows.config_dump import format_config  # noqa: F401 (printed with the plan; its import path)

__all__ = ["RunPlan", "make_plan", "format_plan", "format_config", "count_tokens", "print_once", "report_plan"]

logger = logging.getLogger(__name__)
MEMORY_STAGES = ("pt", "sft", "dpo", "kto", "rm")  # the stages the memory plan sizes


@dataclass
class RunPlan:
    stage: str
    method: str
    train_examples: int | None
    train_tokens: int | None
    trained_tokens: int | None  # labels != -100
    eval_examples: int | None
    batch_size: int  # examples per optimizer step, all processes and accumulation included
    steps_per_epoch: int | None
    total_steps: int
    epochs: float
    trainable_parameters: int
    total_parameters: int
    resume_from: str | None
    attention: str | None = None  # the model's attention implementation
    cutoff_len: int | None = None
    truncation: dict | None = None  # {split: what cutoff_len cut} (lathe.llm.data.truncation); None: unknown
    reference: str | None = None  # dpo / kto: what the policy is compared with
    memory: object | None = None  # lathe.llm.memory.plan.MemoryPlan; None: not estimated
    memory_advice: list = dataclasses.field(default_factory=list)  # what to change when it does not fit


def count_tokens(dataset) -> tuple[int, int]:
    """(tokens, trained tokens) of a tokenized dataset; rows without labels train every token."""
    from lathe.llm.data.preview import trained_fraction

    trained, total = trained_fraction(dataset)
    return total, trained


def world_size(config) -> int:
    """Processes of the job, every node's: the running process group's size, or, in a dry run before
    launch, what the launch settings ask for (NNODES x NPROC_PER_NODE, or ray_num_workers)."""
    return config.processes or config.training.world_size


def make_plan(config, dataset_module: dict, model, resume_from: str | None = None) -> RunPlan:
    """Step arithmetic from lathe.train.batching (the Trainer's own), applied to the tokenized data."""
    from lathe.llm.model.adapters import count_parameters
    from lathe.train.batching import plan_training

    training = config.training
    train = dataset_module.get("train_dataset")
    evaluation = dataset_module.get("eval_dataset")
    batch = training.train_batch_size * world_size(config)
    train_examples = len(train) if train is not None else None
    tokens = trained = None
    steps_per_epoch, total_steps = None, 0
    if train is not None and training.do_train:
        tokens, trained = count_tokens(train)
        batches = len(train) // batch if training.dataloader_drop_last else math.ceil(len(train) / batch)
        schedule = plan_training(training, batches, len(train), training.train_batch_size)
        steps_per_epoch, total_steps = schedule.updates_per_epoch, schedule.max_steps
    if isinstance(evaluation, dict):
        eval_examples = sum(len(part) for part in evaluation.values())
    else:
        eval_examples = len(evaluation) if evaluation is not None else None
    trainable, total = count_parameters(model)
    epochs = total_steps / steps_per_epoch if steps_per_epoch else 0.0
    plan = RunPlan(
        stage=config.finetuning.stage,
        method=describe_method(config.model, config.finetuning),
        train_examples=train_examples,
        train_tokens=tokens,
        trained_tokens=trained,
        eval_examples=eval_examples,
        batch_size=batch * training.gradient_accumulation_steps,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        epochs=epochs,
        trainable_parameters=trainable,
        total_parameters=total,
        resume_from=resume_from,
        attention=getattr(getattr(model, "config", None), "_attn_implementation", None),
        cutoff_len=config.data.cutoff_len,
        truncation=dataset_module.get("truncation"),
        reference=_reference(config),
    )
    if train is not None and training.do_train and config.finetuning.stage in MEMORY_STAGES:
        _plan_memory(plan, config, model, train)
    return plan


def _longest_row(dataset, column: str = "input_ids") -> int:
    import pyarrow.compute as compute

    lengths = compute.list_value_length(dataset.with_format("arrow")[:][column])
    return int(compute.max(lengths).as_py() or 0)


def _padded(length: int) -> int:
    return max(-(-length // 8) * 8, 1)  # the collators pad to a multiple of 8


def _preference_settings(config, train_dataset) -> dict:
    """dpo / rm: chosen and rejected rows padded together (the longer side decides); kto: the target rows
    and the KL rows, padded apart; whether a frozen reference copy is loaded."""
    from lathe.llm.memory.preference import rows_per_forward
    from lathe.llm.preference.reference import reference_kind

    stage = config.finetuning.stage
    if stage == "kto":
        seq_len, kl_seq_len = _longest_row(train_dataset), _padded(_longest_row(train_dataset, "kl_input_ids"))
    else:
        seq_len = max(_longest_row(train_dataset, f"{side}_input_ids") for side in ("chosen", "rejected"))
        kl_seq_len = None
    return {
        "stage": stage,
        "seq_len": _padded(seq_len),
        "kl_seq_len": kl_seq_len,
        "masked": rows_per_forward(stage, config.training.per_device_train_batch_size) > 1,
        "reference_copy": stage != "rm" and reference_kind(config.finetuning, config.training.do_train) == "copy",
        "reference_forward": stage == "kto" or (stage == "dpo" and config.finetuning.use_ref_model),
    }


def loss_chunk(training, vocab: int | None) -> int | None:
    """Tokens per chunk of the chunked cross-entropy when the run asks for it (TrainingArguments'
    chunked_cross_entropy 'auto' or 'yes'), None for the standard loss. 'auto' falls back to the standard
    loss where the model does not allow it; the plan assumes it does and says which path it assumed."""
    if str(getattr(training, "chunked_cross_entropy", "no")) in ("no", "False") or not vocab:
        return None
    size = getattr(training, "chunked_cross_entropy_size", None)
    if size:
        return int(size)
    from lathe.train.loss.chunked import default_chunk_size

    return default_chunk_size(vocab)


def memory_settings(config, train_dataset, model_vocab: int | None = None):
    """The memory plan's view of the run: the longest padded batch of the training data."""
    from lathe.llm.memory.plan import Settings
    from lathe.llm.memory.sharding import sharding_of

    training, model_args = config.training, config.model
    rows = {"seq_len": config.data.cutoff_len, "masked": False}  # pt, packing: full cutoff_len blocks
    if config.finetuning.stage in PREFERENCE_STAGES:
        rows = _preference_settings(config, train_dataset)
    elif config.finetuning.stage != "pt" and not config.data.packing:
        rows = {"seq_len": _padded(_longest_row(train_dataset)), "masked": training.per_device_train_batch_size > 1}
    return Settings(
        batch=training.per_device_train_batch_size,
        optim=str(getattr(training.optim, "value", training.optim)),
        checkpointing=bool(training.gradient_checkpointing),
        accumulation=training.gradient_accumulation_steps,
        half=bool(training.bf16 or training.fp16 or config.finetuning.pure_bf16),
        chunk=None if config.finetuning.stage == "rm" else loss_chunk(training, model_vocab),
        quantization_bit=model_args.quantization_bit if model_args.quantization_method == "bnb" else None,
        double_quant=model_args.double_quantization,
        device=str(training.device),
        sharding=sharding_of(training, world_size(config)),
        **rows,
    )


def _plan_memory(plan: RunPlan, config, model, train_dataset) -> None:
    from lathe.llm.memory.fit import advice, available_memory
    from lathe.llm.memory.layers import has_lora
    from lathe.llm.memory.plan import estimate_memory

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    settings = memory_settings(config, train_dataset, vocab)
    plan.memory = estimate_memory(model, settings, available_memory(config.training.device))
    from lathe.llm.memory.vision import add_vision_terms

    add_vision_terms(plan.memory, model, settings, train_dataset)  # a vision-language model's tower
    if plan.memory is not None and settings.reference_copy and config.finetuning.ref_model is not None:
        plan.memory.notes.append(f"ref_model {config.finetuning.ref_model}: sized as the policy's base model")
    if plan.memory is not None and settings.half and has_lora(model):
        # Measured on the CPU: LoRA under autocast keeps more than its terms count (full fine-tuning: 0.88-0.96).
        plan.memory.notes.append(
            "half precision with LoRA: this plan undercounts (0.67-0.89 of the measured peak on the CPU, "
            "docs/MEMORY.md); leave headroom"
        )
    if plan.memory is not None and not plan.memory.fits:
        plan.memory_advice = advice(plan.memory, model, settings)


def report_plan(config, plan: RunPlan) -> None:
    """Print the plan (main process) and warn, before the first step, when it will not fit the device."""
    print_once(config, format_plan(plan, config))
    memory = plan.memory
    if memory is not None and not memory.fits:
        logger.warning(
            "The memory plan expects a peak of %.0f MiB per device, more than the %.0f MiB %s. Change one of: %s.",
            memory.peak / 2**20,
            memory.available / 2**20,
            "free on the GPU" if memory.device.startswith("cuda") else "of available RAM",
            "; ".join(plan.memory_advice),
        )


def _reference(config) -> str | None:
    from lathe.llm.preference.reference import describe_reference

    return describe_reference(config.finetuning, config.training.do_train)


def _every(strategy, steps, total_steps: int, what: str) -> str:
    strategy = getattr(strategy, "value", strategy)
    if strategy == "no":
        return f"{what}: never"
    if strategy == "epoch":
        return f"{what}: at the end of each epoch"
    if strategy == "best":
        return f"{what}: when the evaluation metric improves"
    if steps is not None and 0 < steps < 1:  # a fraction of the run
        steps = math.ceil(steps * total_steps)
    return f"{what}: every {int(steps)} steps"


def format_plan(plan: RunPlan, config) -> str:
    training = config.training
    lines = [f"Plan: stage {plan.stage}, {plan.method} fine-tuning, output_dir {training.output_dir}"]
    if plan.resume_from:
        lines.append(f"  resume from     {plan.resume_from}")
    if plan.train_examples is not None:
        lines.append(f"  train examples  {plan.train_examples:,}")
    if plan.train_tokens is not None:
        text = f"  train tokens    {plan.train_tokens:,}"
        if plan.trained_tokens is not None:
            share = plan.trained_tokens / max(plan.train_tokens, 1)
            text += f" ({plan.trained_tokens:,} trained, {share:.1%})"
        lines.append(text)
    lines += _truncation_lines(plan)
    if plan.eval_examples is not None:
        lines.append(f"  eval examples   {plan.eval_examples:,}")
    if training.do_train:
        lines.append(
            f"  batch           {plan.batch_size} examples per step = {training.per_device_train_batch_size} per device"
            f" x {training.gradient_accumulation_steps} accumulation x {world_size(config)} process(es)"
        )
        lines.append(
            f"  steps           {plan.steps_per_epoch} per epoch, {plan.total_steps} in total ({plan.epochs:.2f} epochs)"
        )
        lines.append("  " + _every(training.logging_strategy, training.logging_steps, plan.total_steps, "log"))
        lines.append("  " + _every(training.eval_strategy, training.eval_steps, plan.total_steps, "evaluate"))
        save = _every(training.save_strategy, training.save_steps, plan.total_steps, "save")
        if training.save_total_limit:
            save += f", keeping the last {training.save_total_limit}"
        lines.append("  " + save)
    share = plan.trainable_parameters / max(plan.total_parameters, 1)
    lines.append(
        f"  parameters      {plan.trainable_parameters:,} trainable of {plan.total_parameters:,} ({share:.4%})"
    )
    precision = "bf16" if training.bf16 else "fp16" if training.fp16 else "fp32"
    if config.finetuning.pure_bf16:
        precision = "pure bf16"
    lines.append(f"  precision       {precision} on {training.device}")
    checkpointing = (
        "on (disable_gradient_checkpointing: true trades memory for speed)"
        if training.gradient_checkpointing
        else "off"
    )
    lines.append(f"  checkpointing   activations {checkpointing}")
    if training.fsdp or training.deepspeed:
        lines.append(f"  sharding        {_sharding(training)}")
    if plan.reference:
        lines.append(f"  reference       {plan.reference}")
    if plan.attention:
        attention = (
            "sdpa per packed example (no block mask)" if plan.attention == "lathe_packed_sdpa" else plan.attention
        )
        lines.append(f"  attention       {attention}")
    lines += _memory_lines(plan, config)
    return "\n".join(lines)


def _memory_lines(plan: RunPlan, config) -> list[str]:
    from lathe.llm.memory.fit import format_memory

    if plan.memory is not None:
        return format_memory(plan.memory) + [f"    try: {option}" for option in plan.memory_advice]
    if config.training.do_train and plan.stage not in MEMORY_STAGES:
        return [f"  memory          not estimated for stage {plan.stage} (docs/MEMORY.md)"]
    return []


def _truncation_lines(plan: RunPlan) -> list[str]:
    """What cutoff_len does to the data: nothing is cut for pt; for sft, the train split's count (and any
    evaluation split's that was cut), loud when most trained tokens are gone."""
    from lathe.llm.data import truncation

    if plan.stage == "pt":
        return [
            f"  cutoff_len      {plan.cutoff_len}-token rows; no token is cut (a longer document continues "
            f"in the next row)"
        ]
    lines = []
    for split, stats in (plan.truncation or {}).items():
        if not stats or (split != "train" and not stats["truncated_examples"]):
            continue
        label = "truncation" if split == "train" else f"{split} cut"
        text = f"  {label:<15} {truncation.summary(stats, plan.cutoff_len, trained=split == 'train')}"
        if truncation.mostly_cut(stats):
            text += f" -- {truncation.advice(stats, plan.cutoff_len).upper()}"
        lines.append(text)
        if split == "train" and stats.get("rows_before", 0) > stats["examples"]:
            before = stats["rows_before"]
            lines.append(
                f"  left out        {before - stats['examples']} of {before} examples "
                f"({(before - stats['examples']) / before:.1%}; a share above max_dropped_rows_share stops the run)"
            )
    return lines


def _sharding(training) -> str:
    if training.fsdp:
        return "FSDP2 (fully_shard)"
    from lathe.train.parallel.deepspeed_zero import read_config, zero_stage

    source = training.deepspeed if isinstance(training.deepspeed, str) else "config dict"
    return f"DeepSpeed ZeRO stage {zero_stage(read_config(training.deepspeed))} ({source})"


def print_once(config, text: str) -> None:
    """Print on the main process only (every rank of a torchrun launch runs the same recipe)."""
    if config.training.process_index == 0:
        print(text, flush=True)
