"""One generation batch of GRPO: sample the completions, decode them, compute the old and reference
log-probs where needed, call the reward functions, and turn the rewards into advantages, logging TRL's
completions/*, rewards/*, reward, reward_std and frac_reward_zero_std. Under N processes each samples and scores its
rows; the rewards and the logged numbers are gathered (lathe.llm.rl.ranks), the advantages computed over the
whole generation batch and each process keeps its slice, as TRL does."""

from __future__ import annotations

import torch

from lathe.llm.rl import generation, losses, ranks, rewards


def generate_and_score(trainer, rows, mode: str) -> dict:
    args, tokenizer, device = trainer.args, trainer._tokenizer, trainer.args.device
    row_ids = [index for index, _ in rows]
    inputs = [row for _, row in rows]
    prompts, prompt_ids_list, completion_ids_list, env_masks, completions, extras = _completions(
        trainer, inputs, row_ids
    )

    metrics = trainer._metrics[mode]
    truncated = _log_lengths(trainer, metrics, prompt_ids_list, completion_ids_list, mode, env_masks)

    prompt_rows = [torch.tensor(ids) for ids in prompt_ids_list]
    prompt_ids = generation.pad(prompt_rows, tokenizer.pad_token_id, "left").to(device)
    prompt_mask = generation.pad([torch.ones_like(r) for r in prompt_rows], 0, "left").to(device)
    completion_rows = [torch.tensor(ids) for ids in completion_ids_list]
    completion_ids = generation.pad(completion_rows, tokenizer.pad_token_id, "right").to(device)
    completion_mask = generation.pad([torch.ones_like(r) for r in completion_rows], 0, "right").to(device)
    env_mask = None
    if env_masks is not None:  # 0 on tokens the environment wrote: no loss there
        env_mask = generation.pad([torch.tensor(m, dtype=torch.long) for m in env_masks], 1, "right").to(device)
    if args.mask_truncated_completions:
        completion_mask = completion_mask * (~truncated).unsqueeze(1).int().to(device)
        if env_mask is not None:
            env_mask = env_mask * (~truncated).unsqueeze(1).int().to(device)
    loss_mask = completion_mask if env_mask is None else completion_mask * env_mask
    num_items = ranks.gather(loss_mask.sum()).sum()  # the whole generation batch's trained tokens

    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    keep = completion_ids.size(1)
    old_logps, ref_logps = _old_and_reference_logps(trainer, input_ids, attention_mask, keep, mode)

    rewards_per_func = rewards.compute_rewards(
        trainer.reward_funcs,
        trainer.reward_func_names,
        trainer.reward_processing_classes,
        inputs,
        prompts,
        completions,
        completion_ids_list,
        {"trainer_state": trainer.state, **extras},
        row_ids,
        (prompt_ids_list, tokenizer.pad_token_id),
    )
    # Gathered: the groups of num_generations may span processes; each process keeps its rows' advantages.
    rewards_per_func = ranks.gather(rewards_per_func)
    advantages, is_std_zero = trainer.compute_advantages(rewards_per_func, old_logps, ref_logps, loss_mask, mode)
    local = ranks.local_slice(args.process_index, len(prompts))
    _log_rewards(trainer, metrics, rewards_per_func, is_std_zero)
    advantages = advantages[local]
    trainer._last_generation = {
        "completion_ids": completion_ids_list,
        "rewards": rewards_per_func[local].tolist(),
        "advantages": advantages.tolist(),
        "row_ids": row_ids,
    }

    output = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages.to(device),
        "num_items_in_batch": num_items,
    }
    if env_mask is not None:
        output["tool_mask"] = env_mask
    if old_logps is not None:
        output["old_per_token_logps"] = old_logps
    if ref_logps is not None:
        output["ref_per_token_logps"] = ref_logps
    return output


def _completions(trainer, inputs, row_ids):
    """The prompts (as the reward functions see them), prompt and completion ids, the masks of tokens the model
    did not write (None: all its own), the completions (text, or messages for conversations) and extra reward
    arguments: from rollout_func, from rollouts with tools or environments (lathe.llm.rl.tools), or sampled."""
    calling = trainer.tool_calling
    if "prompt" not in inputs[0] and (calling is None or calling.environments is None):
        raise ValueError(f"GRPO: dataset row {row_ids[0]} has no 'prompt' column (columns: {', '.join(inputs[0])}).")
    # With environments a row may carry no prompt: reset() writes it (TRL's empty user message).
    prompts = [row.get("prompt", [{"role": "user", "content": ""}]) for row in inputs]
    if calling is not None and trainer.rollout_func is None:
        from lathe.llm.rl.tools import rollouts_with_tools

        return rollouts_with_tools(trainer, inputs, prompts, row_ids)
    env_masks = None
    if trainer.rollout_func is not None:  # the user's rollouts replace tokenizing and sampling (TRL's rollout_func)
        prompt_ids_list, completion_ids_list, env_masks = _rollouts(trainer, prompts, inputs)
    else:
        prompt_ids_list, completion_ids_list = _sample(trainer, inputs, prompts)
    texts = trainer._tokenizer.batch_decode(completion_ids_list, skip_special_tokens=True)
    conversational = generation.is_conversation(prompts[0])
    completions = [[{"role": "assistant", "content": text}] for text in texts] if conversational else texts
    return prompts, prompt_ids_list, completion_ids_list, env_masks, completions, {}


def _sample(trainer, inputs, prompts):
    """Prompt token ids (rendered beforehand, or by the tokenizer) and the completions sampled by `generate`."""
    args, tokenizer = trainer.args, trainer._tokenizer
    if "prompt_ids" in inputs[0]:  # rendered beforehand (`lathe train`: the template's generation prompt)
        keep = args.max_prompt_length
        prompt_ids_list = [list(row["prompt_ids"])[-keep if keep else 0 :] for row in inputs]
    else:
        prompt_ids_list = generation.tokenize_prompts(
            tokenizer, prompts, args.chat_template_kwargs, args.max_prompt_length
        )
    if args.rollout_engine == "lathe":  # opt-in: lathe's decoding loop, finished rows dropped (rollouts.py)
        from lathe.llm.rl.rollouts import sample_dropping_finished

        with generation.checkpointing_off(trainer.model, args.gradient_checkpointing_kwargs), _whole_weights(trainer):
            completion_ids_list = sample_dropping_finished(
                trainer.model,
                prompt_ids_list,
                trainer.generation_config,
                tokenizer.pad_token_id,
                trainer.eos_token_ids,
                args.device,
            )
        return prompt_ids_list, completion_ids_list
    with _whole_weights(trainer):
        completion_ids_list = generation.sample(
            trainer.model,
            prompt_ids_list,
            trainer.generation_config,
            tokenizer.pad_token_id,
            trainer.eos_token_ids,
            args.device,
            args.gradient_checkpointing_kwargs,
        )
    return prompt_ids_list, completion_ids_list


def _whole_weights(trainer):
    """Under DeepSpeed ZeRO-3 with ds3_gather_for_generation (TRL's default): every weight gathered whole for the
    whole sampling, as TRL's unwrap_model_for_generation does, rather than layer by layer at every token (what
    the partitioned model does by itself, ds3_gather_for_generation false; the same tokens, slower). FSDP2's
    sharded modules gather their weights in their own forward hooks, so sampling needs nothing there."""
    import contextlib

    from lathe.train.parallel import deepspeed_zero

    engine = getattr(trainer, "_zero_engine", None)
    if trainer.args.ds3_gather_for_generation and deepspeed_zero.partitions_weights(engine):
        return deepspeed_zero.gathered_parameters(trainer.model)
    return contextlib.nullcontext()


REQUIRED_ROLLOUT_KEYS = ("prompt_ids", "completion_ids", "logprobs")


def _rollouts(trainer, prompts, inputs):
    """TRL's rollout_func(prompts, trainer) -> {prompt_ids, completion_ids, logprobs, [env_mask], ...}: its token
    ids are trained on as they are; `env_mask` (1: the model's token, 0: the environment's) keeps the
    environment's tokens out of the loss; its other keys reach the reward functions as columns (a list: one value
    per completion)."""
    import copy

    output = trainer.rollout_func(copy.deepcopy(prompts), trainer)
    if not isinstance(output, dict):
        raise ValueError(
            f"rollout_func must return a dict with keys {list(REQUIRED_ROLLOUT_KEYS)}; got {type(output)}."
        )
    missing = sorted(set(REQUIRED_ROLLOUT_KEYS) - output.keys())
    if missing:
        raise ValueError(f"rollout_func must return keys {missing} in its output dict.")
    extra = {k: v for k, v in output.items() if k not in REQUIRED_ROLLOUT_KEYS}
    env_masks = extra.pop("env_mask", None)
    for index, row in enumerate(inputs):
        for key, values in extra.items():
            if isinstance(values, list) and index < len(values):
                row[key] = values[index]
            elif not isinstance(values, list):
                row[key] = values
    prompt_ids = [list(ids) for ids in output["prompt_ids"]]
    completion_ids = [list(ids) for ids in output["completion_ids"]]
    return prompt_ids, completion_ids, None if env_masks is None else [list(m) for m in env_masks]


def _log_lengths(trainer, metrics, prompt_ids_list, completion_ids_list, mode: str, env_masks=None) -> torch.Tensor:
    """TRL's num_tokens and completions/* lengths (of every process's completions); returns which of this
    process's completions were cut at the length limit."""
    tokenizer = trainer._tokenizer
    prompt_lengths = ranks.gather(torch.tensor([len(ids) for ids in prompt_ids_list]))
    # With an environment's tokens in the completions, only the model's count (env_mask 1).
    own = [len(ids) for ids in completion_ids_list] if env_masks is None else [sum(m) for m in env_masks]
    lengths = ranks.gather(torch.tensor(own)).float()
    if mode == "train":
        trainer.state.num_input_tokens_seen += int(prompt_lengths.sum() + lengths.sum())
    metrics["num_tokens"] = [trainer.state.num_input_tokens_seen]
    metrics["completions/mean_length"].append(lengths.mean().item())
    metrics["completions/min_length"].append(lengths.min().item())
    metrics["completions/max_length"].append(lengths.max().item())
    ends = [*trainer.eos_token_ids, tokenizer.pad_token_id]
    truncated = torch.tensor([ids[-1] not in ends for ids in completion_ids_list])
    everywhere = ranks.gather(truncated)
    metrics["completions/clipped_ratio"].append(everywhere.float().mean().item())
    terminated = lengths[~everywhere] if (~everywhere).any() else torch.zeros(1)
    metrics["completions/mean_terminated_length"].append(terminated.mean().item())
    metrics["completions/min_terminated_length"].append(terminated.min().item())
    metrics["completions/max_terminated_length"].append(terminated.max().item())
    return truncated


def _old_and_reference_logps(trainer, input_ids, attention_mask, keep: int, mode: str):
    """The old policy's log-probs (when one generation serves several updates) and the reference's (beta > 0)."""
    args = trainer.args
    old_logps = ref_logps = None
    with torch.no_grad():
        generate_every = args.steps_per_generation * args.num_iterations
        if args.gradient_accumulation_steps % generate_every != 0 or trainer.always_old_logps:
            old_logps = _chunked_logps(trainer.model, input_ids, attention_mask, keep, args, mode)
        if args.beta != 0.0:
            if trainer.ref_model is not None:
                ref_logps = _chunked_logps(trainer.ref_model, input_ids, attention_mask, keep, args, mode)
            else:  # LoRA: the policy with its adapter off is the reference
                with trainer.model.disable_adapter():
                    ref_logps = _chunked_logps(trainer.model, input_ids, attention_mask, keep, args, mode)
    return old_logps, ref_logps


def _log_rewards(trainer, metrics, rewards_per_func, is_std_zero) -> None:
    """TRL's rewards/<func>/mean|std, reward, reward_std and frac_reward_zero_std."""
    for index, name in enumerate(trainer.reward_func_names):
        metrics[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[:, index]).item())
        metrics[f"rewards/{name}/std"].append(losses.nan_std(rewards_per_func[:, index]).item())
    summed = (rewards_per_func * trainer.reward_weights.unsqueeze(0)).nansum(dim=1)
    summed[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    metrics["reward"].append(torch.nanmean(summed).item())
    metrics["reward_std"].append(losses.nan_std(summed).item())
    metrics["frac_reward_zero_std"].append(is_std_zero.float().mean().item())


def _chunked_logps(model, input_ids, attention_mask, keep, args, mode):
    size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
    parts = [
        generation.per_token_logps(
            model, input_ids[i : i + size], attention_mask[i : i + size], keep, args.temperature
        )[0]
        for i in range(0, input_ids.size(0), size)
    ]
    return torch.cat(parts)
