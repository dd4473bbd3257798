"""Reward models of `stage: rm` as GRPO reward functions: a folder holding value_head.safetensors (LLaMA-Factory's
reward-model layout: the causal LM's weights, or its LoRA adapter, and the value head beside them) becomes a
frozen ValueHeadModel whose reward is the value at the last token of prompt + completion, the token ids the
policy sampled, as the reward model was trained (pairs scored at their last token, the template's rendering)."""

from __future__ import annotations

import os

import torch


def is_value_head_folder(folder: str) -> bool:
    from lathe.llm.model.value_head import VALUE_HEAD_FILE, VALUE_HEAD_PICKLE

    return any(os.path.isfile(os.path.join(folder, name)) for name in (VALUE_HEAD_FILE, VALUE_HEAD_PICKLE))


def load_value_head_reward(folder: str):
    """The frozen reward model of a `stage: rm` output folder (full weights, or an adapter merged into its base)."""
    from lathe.llm.model.value_head import ValueHeadModel, load_value_head

    if os.path.isfile(os.path.join(folder, "adapter_config.json")):
        from peft import AutoPeftModelForCausalLM

        base = AutoPeftModelForCausalLM.from_pretrained(folder).merge_and_unload()
    else:
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(folder)
    model = ValueHeadModel(base, dropout=0.0)
    load_value_head(model, folder)
    model.eval().requires_grad_(False)
    model.reward_name = os.path.basename(os.path.normpath(folder))  # TRL names a model reward by its folder
    model.scores_token_ids = True
    return model


def score_token_ids(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int) -> torch.Tensor:
    """The value at the last token of each prompt + completion (right-padded, as the rm stage's pairs)."""
    rows = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)]
    vocab = model.config.vocab_size
    if max(max(row) for row in rows) >= vocab:
        raise ValueError(
            f"reward model {model.reward_name}: the policy's token ids go past its vocabulary ({vocab}); a reward "
            "model from stage rm must share the policy's tokenizer."
        )
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, : len(row)] = torch.tensor(row)
        attention_mask[index, : len(row)] = 1
    device = next(model.parameters()).device
    with torch.inference_mode():
        values = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device))
    last = attention_mask.sum(dim=1, keepdim=True).to(values.device) - 1
    return values.gather(1, last).squeeze(1).float().cpu()
