"""KTO rows: one prompt with one answer tagged desirable or undesirable, plus the mismatched pair the
KL term is estimated on, and the collator that batches both.

As in LLaMA-Factory 0.9.5 (and TRL's KTO): the KL pair of a row is its own prompt with the answer of
the row before it in the same `preprocessing_batch_size` batch (the first row takes the batch's last
answer). Each pair is encoded as one turn and truncated on its own with `infer_seqlen`; labels are -100
on the prompt. `kto_tags` is true for a desirable answer.
"""

from __future__ import annotations

import logging
from collections import Counter

from lathe.llm.data.pairwise import check_preference_example, encode_one_answer
from lathe.llm.data.supervised import SkippedExample, report_skips, infer_seqlen
from lathe.train.data.labels import IGNORE_INDEX

logger = logging.getLogger("lathe.llm.data")

FEEDBACK_COLUMNS = (
    "input_ids",
    "attention_mask",
    "labels",
    "kl_input_ids",
    "kl_attention_mask",
    "kl_labels",
    "kto_tags",
)


def tagged_answer(response: list[dict]) -> tuple[dict, bool]:
    """(the answer, desirable?) of a canonical KTO response: [answer, ""] is desirable, ["", answer] is not."""
    return (response[0], True) if response[0]["content"] else (response[1], False)


def _encode(prompt, answer, system, tools, template, tokenizer, cutoff_len: int) -> tuple[list[int], list[int]]:
    prompt_ids, answer_ids = encode_one_answer(prompt, answer, system, tools, template, tokenizer)
    source_len, target_len = infer_seqlen(len(prompt_ids), len(answer_ids), cutoff_len)
    answer_ids = answer_ids[:target_len]
    return prompt_ids[:source_len] + answer_ids, [IGNORE_INDEX] * source_len + answer_ids


def encode_feedback_example(prompt, response, kl_response, system, tools, template, tokenizer, cutoff_len: int) -> dict:
    answer, desirable = tagged_answer(response)
    kl_answer, _ = tagged_answer(kl_response)
    input_ids, labels = _encode(prompt, answer, system, tools, template, tokenizer, cutoff_len)
    kl_input_ids, kl_labels = _encode(prompt, kl_answer, system, tools, template, tokenizer, cutoff_len)
    if all(label == IGNORE_INDEX for label in labels):
        raise SkippedExample(f"no answer token left after truncation to cutoff_len={cutoff_len}")
    return {
        "input_ids": input_ids,
        "attention_mask": [1] * len(input_ids),
        "labels": labels,
        "kl_input_ids": kl_input_ids,
        "kl_attention_mask": [1] * len(kl_input_ids),
        "kl_labels": kl_labels,
        "kto_tags": desirable,
    }


def preprocess_feedback_dataset(examples: dict, template, tokenizer, data_args, skipped: Counter | None = None):
    """A batched `datasets.map` function: canonical columns -> the KTO columns (FEEDBACK_COLUMNS)."""
    model_inputs = {column: [] for column in FEEDBACK_COLUMNS}
    responses = examples["_response"]
    kl_responses = responses[-1:] + responses[:-1]  # each prompt with the previous row's answer
    batch_skipped = Counter()
    count = len(examples["_prompt"])
    systems = examples.get("_system") or [None] * count
    tools = examples.get("_tools") or [None] * count
    for prompt, response, kl_response, system, tool_text in zip(
        examples["_prompt"], responses, kl_responses, systems, tools
    ):
        try:
            check_preference_example(prompt, response, system, tool_text)
            check_preference_example(prompt, kl_response, system, tool_text)
            row = encode_feedback_example(
                prompt, response, kl_response, system, tool_text, template, tokenizer, data_args.cutoff_len
            )
        except SkippedExample as skip:
            batch_skipped[skip.reason] += 1
            continue
        for column in FEEDBACK_COLUMNS:
            model_inputs[column].append(row[column])
    report_skips("KTO", batch_skipped, count, skipped)
    desirable = sum(model_inputs["kto_tags"])
    if model_inputs["kto_tags"] and desirable in (0, len(model_inputs["kto_tags"])):
        logger.warning("This batch of KTO data has only %s answers.", "desirable" if desirable else "undesirable")
    return model_inputs


class KTODataCollator:
    """KTO rows -> the padded target batch (input_ids, attention_mask, labels), the padded KL batch
    (kl_input_ids, kl_attention_mask, kl_labels) and kto_tags (bool)."""

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = 8, label_pad_token_id: int = IGNORE_INDEX):
        from lathe.llm.data.collator import SFTDataCollator

        self.pad = SFTDataCollator(
            tokenizer, pad_to_multiple_of=pad_to_multiple_of, label_pad_token_id=label_pad_token_id
        )

    def __call__(self, features: list[dict]) -> dict:
        import torch

        batch = self.pad(
            [{name: feature[name] for name in ("input_ids", "attention_mask", "labels")} for feature in features]
        )
        kl = self.pad(
            [
                {name: feature[f"kl_{name}"] for name in ("input_ids", "attention_mask", "labels")}
                for feature in features
            ]
        )
        batch.update({f"kl_{name}": value for name, value in kl.items()})
        batch["kto_tags"] = torch.tensor([bool(feature["kto_tags"]) for feature in features])
        return batch
