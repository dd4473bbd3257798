"""Whether a memory plan fits the device: its free memory, the plan's lines in `lathe train`'s output,
and what to change when it does not fit."""

from __future__ import annotations

from lathe.llm.memory.layers import has_lora
from lathe.llm.memory.plan import BATCH_LIMIT, MIB, MemoryPlan, Settings, fill_batch_terms, model_shape
from lathe.llm.memory.preference import PAIRED_STAGES, rows_per_forward

__all__ = ["available_memory", "format_memory", "advice"]


def available_memory(device) -> int | None:
    """Free memory of the device the run trains on: free GPU memory, or available RAM on the CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _mib(value: int) -> str:
    return f"{value / MIB:,.0f} MiB" if value >= 10 * MIB else f"{value / MIB:.1f} MiB"


def format_memory(plan: MemoryPlan) -> list[str]:
    """The plan's lines under 'Plan:' in `lathe train`'s output."""
    switched = "without" if plan.checkpointing else "with"
    reference = f", reference model {_mib(plan.reference)}" if plan.reference else ""
    batch = f"{plan.batch_size}"
    if plan.stage in PAIRED_STAGES:
        batch = f"{plan.batch_size} pairs ({rows_per_forward(plan.stage, plan.batch_size)} rows)"
    lines = [
        f"  memory          {_mib(plan.peak)} peak per device, expected for {batch} x {plan.seq_len} "
        f"tokens, {plan.loss_path}",
        f"    weights {_mib(plan.weights)}{reference}, gradients {_mib(plan.gradients)}, optimizer {_mib(plan.optimizer)}, "
        f"activations {_mib(plan.activations)} ({_mib(plan.activations_other)} {switched} checkpointing), "
        f"logits {_mib(plan.logits)}"
        + (f", gathered while computing {_mib(plan.gathered)}" if plan.gathered else "")
        + (f", DDP buckets {_mib(plan.buckets)}" if plan.buckets else "")
        + (f", sampling (KV cache) {_mib(plan.generation)}" if plan.generation else ""),
    ]
    if plan.available is not None:
        where = "free on the GPU" if plan.device.startswith("cuda") else "available RAM"
        verdict = "fits" if plan.fits else "DOES NOT FIT"
        largest = f"{plan.largest_batch:,}" + (" or more" if plan.largest_batch >= BATCH_LIMIT else "")
        lines.append(f"    {verdict}: {_mib(plan.available)} {where}; largest batch that fits: {largest}")
    lines += [f"    note: {note}" for note in plan.notes]
    return lines


def advice(plan: MemoryPlan, model, settings: Settings) -> list[str]:
    """What to change when the plan does not fit, each with the peak the change gives."""
    import dataclasses

    shape = model_shape(model)

    def peak_with(**changes) -> int:
        trial = dataclasses.replace(plan, notes=[])
        fill_batch_terms(trial, model, shape, dataclasses.replace(settings, **changes))
        return trial.peak

    options = []
    if plan.largest_batch:
        options.append(
            f"per_device_train_batch_size: {plan.largest_batch} ({_mib(peak_with(batch=plan.largest_batch))}; raise "
            "gradient_accumulation_steps to keep the batch per step)"
        )
    if not settings.checkpointing:
        options.append(
            f"gradient checkpointing (disable_gradient_checkpointing: false): {_mib(peak_with(checkpointing=True))}"
        )
    if not has_lora(model) and plan.gradients + plan.optimizer + plan.reference > plan.peak // 10:
        # dpo / kto: with lora the reference is the policy with its adapter off, no copy.
        reference = " and the reference copy" if plan.reference else ""
        options.append(
            f"finetuning_type: lora (frees most of the {_mib(plan.gradients + plan.optimizer + plan.reference)} of "
            f"gradients, optimizer state{reference})"
        )
    if not settings.quantization_bit:
        options.append(
            f"quantization_bit: 4 with lora (QLoRA: the decoder's weights at about 0.27x of {_mib(plan.weights)})"
        )
    options += _chunked_loss_option(plan, settings, peak_with, shape.vocab)
    shorter = settings.seq_len // 2
    if shorter >= 8:
        options.append(f"cutoff_len: {shorter} ({_mib(peak_with(seq_len=shorter))})")
    return options


def start_batch_from_plan(trainer, plan: MemoryPlan | None) -> None:
    """auto_find_batch_size: start the search at the plan's largest fitting batch instead of at an
    out-of-memory error (the Trainer still shrinks it further on one)."""
    import logging

    if plan is None or plan.largest_batch is None or not trainer.args.auto_find_batch_size:
        return
    start = max(plan.largest_batch, 1)
    if start < trainer._train_batch_size:
        logging.getLogger(__name__).warning(
            "auto_find_batch_size: starting at batch size %d, the largest the memory plan fits (asked: %d).",
            start,
            trainer._train_batch_size,
        )
        trainer._train_batch_size = start


def _chunked_loss_option(plan: MemoryPlan, settings: Settings, peak_with, vocab: int) -> list[str]:
    """The chunked cross-entropy (lathe.train.loss.chunked) when the run uses the standard loss and its
    logits are a large part of the peak."""
    if settings.chunk is not None or settings.stage == "rm" or plan.logits < plan.peak // 5:
        return []  # rm: the value head's LM builds its logits whatever the loss path
    try:
        from lathe.train.loss.chunked import default_chunk_size
    except ImportError:  # a lathe without the chunked loss
        return []
    chunk = default_chunk_size(vocab)
    return [
        f"chunked_cross_entropy: auto (logits {_mib(plan.logits)} -> one chunk at a time: {_mib(peak_with(chunk=chunk))})"
    ]
