"""Sampling for GRPO: prompts rendered (chat template with the generation prompt for conversations, plain
tokenization otherwise), left-padded, and sampled with the model's `generate` under the GenerationConfig
TRL builds, so the global RNG is drawn from in the same order and a fixed seed gives TRL's tokens. The
completion ends at its first end-of-sequence token (kept); what follows is dropped."""

from __future__ import annotations

import contextlib

import torch


def is_conversation(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def generation_config(args, tokenizer, eos_token_ids):
    from transformers import GenerationConfig

    settings = {
        "max_new_tokens": args.max_completion_length,
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos_token_ids,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "cache_implementation": None,
    }
    settings.update(args.generation_kwargs or {})
    return GenerationConfig(**settings, disable_compile=True)


def eos_ids_of(model, tokenizer) -> list[int]:
    """Every end id the model's generation config declares, and the tokenizer's."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id not in ids:
        ids = [tokenizer.eos_token_id, *ids]
    return ids


def tokenize_prompts(tokenizer, prompts, chat_template_kwargs=None, max_prompt_length=None) -> list[list[int]]:
    if is_conversation(prompts[0]):
        encoded = tokenizer.apply_chat_template(
            conversation=prompts,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **(chat_template_kwargs or {}),
        )
        ids = [list(x) for x in encoded["input_ids"]]
    else:
        ids = tokenizer(text=prompts)["input_ids"]
    if max_prompt_length is not None:  # keep the end of the prompt, where the question and the generation prompt are
        ids = [x[-max_prompt_length:] for x in ids]
    return ids


def pad(rows: list[torch.Tensor], value, side: str) -> torch.Tensor:
    width = max(row.size(0) for row in rows)
    out = torch.full((len(rows), width), value, dtype=rows[0].dtype)
    for index, row in enumerate(rows):
        if side == "left":
            out[index, width - row.size(0) :] = row
        else:
            out[index, : row.size(0)] = row
    return out


@contextlib.contextmanager
def checkpointing_off(model, checkpointing_kwargs=None):
    """Activation checkpointing switches the KV cache off: it is off while sampling, as TRL does."""
    checkpointing = bool(getattr(model, "is_activation_checkpointing", False))
    if checkpointing:
        model.activation_checkpointing_disable()
    try:
        yield
    finally:
        if checkpointing:
            from lathe.train.runtime import enable_gradient_checkpointing

            enable_gradient_checkpointing(model, checkpointing_kwargs)  # as the Trainer enabled it


def sample(model, prompt_ids, config, pad_id: int, eos_ids: list[int], device, checkpointing_kwargs=None):
    rows = [torch.tensor(ids) for ids in prompt_ids]
    input_ids = pad(rows, pad_id, "left").to(device)
    attention_mask = pad([torch.ones_like(r) for r in rows], 0, "left").to(device)
    with checkpointing_off(model, checkpointing_kwargs), torch.no_grad():
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    completions = output[:, input_ids.size(1) :].cpu()
    is_eos = torch.isin(completions, torch.tensor(eos_ids))
    ends = torch.full((completions.size(0),), completions.size(1), dtype=torch.long)
    found = is_eos.any(dim=1)
    ends[found] = is_eos.int().argmax(dim=1)[found]
    return [row[: int(end) + 1].tolist() for row, end in zip(completions, ends)]


def per_token_logps(model, input_ids, attention_mask, logits_to_keep: int, temperature: float, entropy: bool = False):
    """Log-probabilities of the last `logits_to_keep` tokens under the temperature-scaled model (0 where the
    attention mask is 0), and their distributions' entropies when asked."""
    outputs = model(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=logits_to_keep + 1
    )
    logits = outputs.logits[:, :-1].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, -logits_to_keep:]
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    valid = attention_mask[:, -logits_to_keep:].bool()
    logps = logps.masked_fill(~valid, 0.0)
    entropies = None
    if entropy:
        with torch.no_grad():
            entropies = -(log_probs.exp() * log_probs).sum(-1).masked_fill(~valid, 0.0)
    return logps, entropies
