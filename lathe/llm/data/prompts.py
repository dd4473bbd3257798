"""Stage grpo's prompts: datasets registered in dataset_info.json as LLaMA-Factory registers them (a sharegpt /
openai conversation without the assistant's answer, or an alpaca instruction), converted by the same converters,
each row becoming TRL's `prompt` (the conversation, system message first) with `prompt_ids` (rendered by the
template with its generation prompt) and every column no registry role reads, for the reward functions."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from lathe.llm.data.converters import CANONICAL_COLUMNS

logger = logging.getLogger("lathe.llm.data")

# The arguments of GRPO's reward call: a data column of that name would hide them.
RESERVED = ("prompt", "prompt_ids", "completions", "completion_ids", "prompts", "trainer_state")


@dataclass
class PromptRows:
    """The batched `datasets.map` function: canonical rows -> prompt, prompt_ids and the extra columns."""

    template: Any
    tokenizer: Any
    name: str

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        from lathe.llm.templates import InvalidMessage

        prompts, ids = [], []
        for index, messages, system, tools in zip(indices, batch["_prompt"], batch["_system"], batch["_tools"]):
            if not messages or messages[-1]["role"] != "user":
                raise ValueError(
                    f"dataset '{self.name}' row {index + 1}: a GRPO prompt must end with a user turn "
                    f"(the model answers it); got {[m['role'] for m in messages]}."
                )
            try:
                encoded, _ = self.template.encode_oneturn(
                    self.tokenizer, list(messages) + [{"role": "assistant", "content": ""}], system, tools
                )
            except InvalidMessage as error:
                raise ValueError(f"dataset '{self.name}' row {index + 1}: {error}") from None
            conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
            prompts.append(([{"role": "system", "content": system}] if system else []) + conversation)
            ids.append(encoded)
        extras = {key: value for key, value in batch.items() if key not in CANONICAL_COLUMNS}
        return {"prompt": prompts, "prompt_ids": ids, **extras}


def get_prompt_dataset(template, model_args, data_args, training_args, tokenizer, cache_dir: str | None = None):
    """The training prompts ({"train_dataset": Dataset, "eval_dataset": None}) in LLaMA-Factory's order:
    each dataset read, sampled (num_samples, max_samples) and converted, then mixed (mix_strategy)."""
    from lathe.llm.data.loader import load_datasets, merge_datasets
    from lathe.llm.data.pipeline import DEFAULT_CACHE_DIR
    from lathe.llm.data.registry import get_dataset_list
    from lathe.llm.hub import resolve_hub_datasets

    attrs = get_dataset_list(data_args.dataset, data_args.dataset_dir)
    resolve_hub_datasets(attrs, model_args)
    rng = np.random.RandomState(training_args.seed)  # LLaMA-Factory's draws after set_seed(seed)
    raw = os.path.join(os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR), "raw")
    loaded, _ = load_datasets(attrs, data_args, "grpo", rng, raw)
    prepared = []
    by_name = {attr.name: attr for attr in attrs}
    for name, dataset in loaded.items():
        attr = by_name[name]
        clash = [column for column in dataset.column_names if column in RESERVED]
        if clash:
            raise ValueError(
                f"{attr.where('columns')}: column(s) {', '.join(clash)} would hide GRPO's own arguments of the "
                "reward functions; rename them in the data file."
            )
        prepared.append(
            dataset.map(
                PromptRows(template, tokenizer, attr.name),
                batched=True,
                with_indices=True,
                remove_columns=list(CANONICAL_COLUMNS),
                desc=f"Rendering the prompts of {attr.name}",
            )
        )
    train = merge_datasets(prepared, data_args, training_args.seed)
    lengths = [len(ids) for ids in train["prompt_ids"]]
    logger.info("GRPO prompts: %d rows, %d tokens, the longest %d", len(train), sum(lengths), max(lengths))
    return {"train_dataset": train, "eval_dataset": None}
