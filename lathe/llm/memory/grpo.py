"""The memory plan of stage grpo: the training step of a policy-gradient micro-batch (prompt + completion rows,
full-vocabulary log-probs, as the plan sizes sft) and, at another moment of the step, the sampling of a whole
generation batch: its KV cache (rows x (prompt + max_completion_length) tokens x layers x 2 x key/value width)
and the next-token scores. The reference model: a frozen copy only for full / freeze fine-tuning with beta > 0;
none under LoRA (the policy with its adapters off) and none at beta 0; GRPO's reference copy is whole on every
process, also under FSDP2 / ZeRO (it is not sharded like dpo's).

On N processes the plan is one process's: its share of the generation batch (per_device_train_batch_size x
steps_per_generation rows) is what it samples. Under ZeRO-3 with ds3_gather_for_generation (TRL's default) every
weight is gathered whole for the whole sampling (the other processes' shards on top of its own); under FSDP2,
or ZeRO-3 without it, sampling gathers block by block as the training forward does (the plan's `gathered`)."""

from __future__ import annotations

import dataclasses

from lathe.llm.memory.plan import BATCH_LIMIT, MemoryPlan, Settings, estimate_memory, fill_batch_terms, model_shape

__all__ = ["estimate_grpo_memory", "sampling_bytes"]


def sampling_bytes(shape, rows: int, prompt_len: int, completion_len: int, element: int) -> int:
    """What sampling `rows` completions at once holds besides the weights: the KV cache of every layer at its
    full length, the prefill's widest transient (MLP-wide, over the prompt) and the float32 next-token scores
    (logits, processed scores, probabilities)."""
    tokens = prompt_len + completion_len
    cache = rows * tokens * shape.layers * 2 * shape.kv_heads * shape.head_dim * element
    prefill = rows * prompt_len * (2 * shape.hidden + shape.intermediate) * element
    scores = rows * shape.vocab * 4 * 3
    return cache + max(prefill, scores)


def gathered_for_sampling(plan: MemoryPlan, sharding, gather_whole: bool) -> int:
    """What a process holds whole, beyond its shards, while it samples (module docstring)."""
    if sharding is None or not sharding.weights:
        return 0
    if sharding.kind == "zero" and gather_whole:
        return plan.weights * (sharding.world - 1)
    return plan.gathered


def _complete(
    plan: MemoryPlan,
    shape,
    settings: Settings,
    steps_per_generation: int,
    prompt_len: int,
    completion_len: int,
    gather_whole: bool = True,
):
    element = 2 if settings.half else 4
    plan.generation = sampling_bytes(shape, settings.batch * steps_per_generation, prompt_len, completion_len, element)
    # The step's peak (the reference copy held throughout), or sampling's: weights (with what is gathered whole
    # under sharding), optimizer state, the reference and the cache; gradients are released after each optimizer
    # step, before the next sampling.
    held = gathered_for_sampling(plan, settings.sharding, gather_whole)
    sampling = plan.weights + held + plan.optimizer + plan.reference + plan.buckets + plan.generation
    plan.peak = max(plan.peak + plan.reference, sampling)


def estimate_grpo_memory(
    model,
    settings: Settings,
    available: int | None,
    steps_per_generation: int,
    prompt_len: int,
    completion_len: int,
    gather_whole: bool = True,
) -> MemoryPlan | None:
    """The plan for `settings` (seq_len: the longest prompt + max_completion_length; reference_copy: a frozen
    copy is loaded; sharding: the run's, its reference whole), with sampling's term (gather_whole:
    ds3_gather_for_generation) and the largest per-device batch that fits both moments."""
    plan = estimate_memory(model, settings, None)  # its largest batch would leave sampling out: searched below
    shape = model_shape(model)
    if plan is None or shape is None:
        return None
    plan.available = available
    _complete(plan, shape, settings, steps_per_generation, prompt_len, completion_len, gather_whole)
    held = gathered_for_sampling(plan, settings.sharding, gather_whole)
    if held:
        how = "every weight, ds3_gather_for_generation" if plan.gathered != held else "block by block"
        plan.notes.append(
            f"sampling gathers {held / 2**20:,.1f} MiB of weights whole beside this process's shards ({how})"
        )
    if available is None:
        plan.largest_batch = None
        return plan

    def fits(batch: int) -> bool:
        trial = dataclasses.replace(plan, notes=[])
        trial_settings = dataclasses.replace(settings, batch=batch)
        fill_batch_terms(trial, model, shape, trial_settings)
        _complete(trial, shape, trial_settings, steps_per_generation, prompt_len, completion_len, gather_whole)
        return trial.peak <= available

    low, high = 0, 1
    while high <= BATCH_LIMIT and fits(high):
        low, high = high, high * 2
    high = min(high, BATCH_LIMIT + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    plan.largest_batch = low
    return plan
