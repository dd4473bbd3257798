"""GRPO's opt-in rollout engine (`rollout_engine: lathe`): the completions of a generation batch sampled by one
batched decoding loop over a KV cache that drops each row as soon as it has ended, so the last, longest
completions are not decoded beside the rows already finished (transformers' `generate`, the default, keeps
every row to the end and pads the finished ones).

Each step scores the active rows with transformers' own logits processors in `generate`'s order (repetition
penalty over the row's prompt and completion, then temperature, top-k, top-p, min-p), and picks the argmax
(greedy: the same tokens as `generate`) or draws from the softmax. The draws come from the global RNG as
`generate`'s do, but from fewer rows once rows end, so a sampled completion is not `generate`'s token for token:
the distribution is the same, the tokens are not (hence opt-in; the default stays TRL's draws)."""

from __future__ import annotations

import torch

# GenerationConfig settings this engine reads (GRPO's sampling keys); any other generation_kwargs key is refused.
READ_SETTINGS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens")


def check_generation_kwargs(generation_kwargs) -> None:
    unread = sorted(set(generation_kwargs or {}) - set(READ_SETTINGS))
    if unread:
        raise ValueError(
            f"generation_kwargs {', '.join(unread)} are not read by rollout_engine 'lathe' (it reads "
            f"{', '.join(READ_SETTINGS)}): use rollout_engine 'generate' for them."
        )


def _warpers(config):
    """transformers' sampling warpers for `config`, in `generate`'s order (none when greedy)."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    if not config.do_sample:
        return []
    warpers = []
    if config.temperature is not None and config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k:
        warpers.append(TopKLogitsWarper(top_k=config.top_k))
    if config.top_p is not None and config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p))
    if config.min_p is not None:
        warpers.append(MinPLogitsWarper(min_p=config.min_p))
    return warpers


def _left_pad(prompt_ids, pad_id: int, device):
    width = max(len(ids) for ids in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[row, width - len(ids) :] = 1
    return input_ids.to(device), mask.to(device)


@torch.no_grad()
def sample_dropping_finished(model, prompt_ids, config, pad_id: int, eos_ids: list[int], device) -> list[list[int]]:
    """Completions of `prompt_ids` (lists of token ids) under GenerationConfig `config`, each ending at its first
    end-of-sequence token (kept) or at max_new_tokens, as generation.sample returns them."""
    from transformers import DynamicCache, RepetitionPenaltyLogitsProcessor

    input_ids, mask = _left_pad(prompt_ids, pad_id, device)
    padding = (mask == 0).sum(dim=1)
    warpers = _warpers(config)
    eos = torch.tensor(eos_ids, device=device)
    completions: list[list[int]] = [[] for _ in prompt_ids]
    active = torch.arange(len(prompt_ids), device=device)  # the original row of each row still decoded
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = DynamicCache(config=model.config)
    step_ids, step_positions = input_ids, positions
    for _ in range(config.max_new_tokens):
        output = model(
            input_ids=step_ids, attention_mask=mask, position_ids=step_positions, past_key_values=cache, use_cache=True
        )
        scores = output.logits[:, -1, :].float()
        if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
            penalty = RepetitionPenaltyLogitsProcessor(config.repetition_penalty, prompt_ignore_length=padding)
            scores = penalty(input_ids, scores)
        for warper in warpers:
            scores = warper(input_ids, scores)
        if config.do_sample:
            tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            tokens = scores.argmax(dim=-1)
        for row, token in zip(active.tolist(), tokens.tolist()):
            completions[row].append(token)
        ended = torch.isin(tokens, eos)
        input_ids = torch.cat([input_ids, tokens[:, None]], dim=1)
        mask = torch.cat([mask, mask.new_ones((mask.size(0), 1))], dim=1)
        step_positions = positions[:, -1:] + 1
        positions = step_positions
        if ended.any():  # the ended rows leave the batch, their cache rows with them
            keep = (~ended).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            cache.batch_select_indices(keep)
            active, input_ids, mask, padding = active[keep], input_ids[keep], mask[keep], padding[keep]
            tokens, positions, step_positions = tokens[keep], positions[keep], step_positions[keep]
        step_ids = tokens[:, None]
    return completions
