"""Pairwise (rm and dpo) rows: one prompt with a chosen and a rejected answer -> two token sequences
that share the prompt, and the collator that batches them as one forward pass (chosen rows first,
then rejected rows).

Tokenization is LLaMA-Factory 0.9.5's, token for token: the prompt and each answer are encoded by the
template as one turn (the prompt ids of the chosen conversation serve both sides); with an
efficient_eos template each answer gets an EOS. Truncation gives the two answers one shared budget,
`infer_seqlen(prompt, longer answer, cutoff_len)`, so both sides keep the same prompt. Labels are -100
on the prompt. Rows that cannot be encoded, or whose answers lose every token to truncation, are
skipped and counted by reason.
"""

from __future__ import annotations

import logging
from collections import Counter

from lathe.llm.data.supervised import (
    SkippedExample,
    check_supervised_example,
    expand_media,
    finish_media,
    infer_seqlen,
    media_columns,
    report_skips,
)
from lathe.llm.templates.tools import InvalidMessage
from lathe.train.data.labels import IGNORE_INDEX

logger = logging.getLogger("lathe.llm.data")

SIDES = ("chosen", "rejected")
PAIRWISE_COLUMNS = tuple(f"{side}_{name}" for side in SIDES for name in ("input_ids", "attention_mask", "labels"))


def check_preference_example(prompt, response, system, tools) -> None:
    """The canonical shape of a preference row: an odd, alternating prompt and a two-message response."""
    if not isinstance(response, list) or len(response) != 2:
        raise SkippedExample("response is not a pair of answers")
    check_supervised_example(prompt, response[:1], system, tools)
    check_supervised_example(prompt, response[1:], system, tools)


def encode_one_answer(prompt, answer, system, tools, template, tokenizer) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of the conversation prompt + [answer], EOS added for efficient_eos."""
    try:
        prompt_ids, answer_ids = template.encode_oneturn(tokenizer, prompt + [answer], system, tools)
    except InvalidMessage as error:
        raise SkippedExample(str(error)) from None
    if template.efficient_eos:
        answer_ids = answer_ids + [tokenizer.eos_token_id]
    return prompt_ids, answer_ids


def encode_pairwise_example(
    prompt, response, system, tools, template, tokenizer, cutoff_len: int, media_prompts=None
) -> dict[str, list[int]]:
    """One row -> chosen_* and rejected_* input_ids / attention_mask / labels, at most cutoff_len tokens each.
    `media_prompts`: (chosen, rejected) of (prompt, answer) with the media placeholders expanded per side, as
    LLaMA-Factory expands each side's conversation."""
    sides = media_prompts or ((prompt, response[0]), (prompt, response[1]))
    prompt_ids, chosen_ids = encode_one_answer(sides[0][0], sides[0][1], system, tools, template, tokenizer)
    _, rejected_ids = encode_one_answer(sides[1][0], sides[1][1], system, tools, template, tokenizer)
    # One budget for both answers (the longer one decides), so the prompt is cut the same way on both sides.
    source_len, target_len = infer_seqlen(len(prompt_ids), max(len(chosen_ids), len(rejected_ids)), cutoff_len)
    if target_len == 0:
        raise SkippedExample(f"no answer token left after truncation to cutoff_len={cutoff_len}")
    prompt_ids = prompt_ids[:source_len]
    row = {}
    for side, answer_ids in zip(SIDES, (chosen_ids, rejected_ids)):
        answer_ids = answer_ids[:target_len]
        row[f"{side}_input_ids"] = prompt_ids + answer_ids
        row[f"{side}_attention_mask"] = [1] * (source_len + len(answer_ids))
        row[f"{side}_labels"] = [IGNORE_INDEX] * source_len + answer_ids
    return row


def media_sides(media, examples: dict, index: int, prompt, answers):
    """(the media paths, the opened media, [(prompt, answer)] per answer with the placeholders expanded) of a
    preference row; no media: (paths, {}, None)."""
    sides, paths, opened = [], {}, {}
    for answer in answers:
        side_prompt, side_answer, paths, opened = expand_media(media, examples, index, prompt, [answer])
        sides.append((side_prompt, side_answer[0]))
    return paths, opened, (sides if opened else None)


def preprocess_pairwise_dataset(
    examples: dict,
    template,
    tokenizer,
    data_args,
    skipped: Counter | None = None,
    media=None,
    media_kinds: tuple = (),
):
    """A batched `datasets.map` function: canonical columns -> the six chosen_*/rejected_* columns (and the
    media columns `media_kinds` with a MediaEncoder `media`, as in supervised.preprocess_supervised_dataset)."""
    model_inputs = {column: [] for column in PAIRWISE_COLUMNS}
    batch_skipped = Counter()
    count = len(examples["_prompt"])
    systems = examples.get("_system") or [None] * count
    tools = examples.get("_tools") or [None] * count
    paths = []
    rows = zip(examples["_prompt"], examples["_response"], systems, tools)
    for index, (prompt, response, system, tool_text) in enumerate(rows):
        try:
            check_preference_example(prompt, response, system, tool_text)
            row_paths, opened, sides = media_sides(media, examples, index, prompt, response)
            # PaliGemma's image prefix is kept whole within cutoff_len (LLaMA-Factory counts it in the prompt)
            budget = data_args.cutoff_len - (media.prefix_length(opened) if opened else 0)
            row = encode_pairwise_example(prompt, response, system, tool_text, template, tokenizer, budget, sides)
            for side in SIDES:
                ids, labels = finish_media(media, opened, row[f"{side}_input_ids"], row[f"{side}_labels"], row_paths)
                row[f"{side}_input_ids"], row[f"{side}_labels"] = ids, labels
        except SkippedExample as skip:
            batch_skipped[skip.reason] += 1
            continue
        for column in PAIRWISE_COLUMNS:
            model_inputs[column].append(row[column])
        paths.append(row_paths)
    report_skips("Pairwise", batch_skipped, count, skipped)
    return {**model_inputs, **media_columns(paths, media_kinds)}


class PairwiseDataCollator:
    """n pairwise rows -> one padded batch of 2n sequences: the n chosen ones, then the n rejected ones,
    so the policy sees both sides in a single forward pass (as LLaMA-Factory's collator lays them out)."""

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = 8, label_pad_token_id: int = IGNORE_INDEX):
        from lathe.llm.data.collator import SFTDataCollator

        self.pad = SFTDataCollator(
            tokenizer, pad_to_multiple_of=pad_to_multiple_of, label_pad_token_id=label_pad_token_id
        )

    def __call__(self, features: list[dict]) -> dict:
        rows = [
            {
                "input_ids": feature[f"{side}_input_ids"],
                "attention_mask": feature[f"{side}_attention_mask"],
                "labels": feature[f"{side}_labels"],
                # both sides carry the row's media (a multimodal pad: lathe.llm.multimodal.collator)
                **{key: feature[key] for key in MEDIA_KEYS if key in feature},
            }
            for side in SIDES
            for feature in features
        ]
        return self.pad(rows)


MEDIA_KEYS = ("images", "videos", "audios")
