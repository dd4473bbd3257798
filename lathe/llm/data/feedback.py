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

from lathe.llm.data.pairwise import MEDIA_KEYS, check_preference_example, encode_one_answer, media_sides
from lathe.llm.data.supervised import SkippedExample, finish_media, infer_seqlen, media_columns, report_skips
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


def encode_feedback_example(
    prompt, response, kl_response, system, tools, template, tokenizer, cutoff_len: int, media_prompts=None
) -> dict:
    """`media_prompts`: [(prompt, answer), (prompt, KL answer)] with the media placeholders expanded."""
    answer, desirable = tagged_answer(response)
    kl_answer, _ = tagged_answer(kl_response)
    (prompt, answer), (kl_prompt, kl_answer) = media_prompts or ((prompt, answer), (prompt, kl_answer))
    input_ids, labels = _encode(prompt, answer, system, tools, template, tokenizer, cutoff_len)
    kl_input_ids, kl_labels = _encode(kl_prompt, kl_answer, system, tools, template, tokenizer, cutoff_len)
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


def preprocess_feedback_dataset(
    examples: dict,
    template,
    tokenizer,
    data_args,
    skipped: Counter | None = None,
    media=None,
    media_kinds: tuple = (),
):
    """A batched `datasets.map` function: canonical columns -> the KTO columns (FEEDBACK_COLUMNS), and the media
    columns `media_kinds` with a MediaEncoder `media` (the row's media serve its KL pair too, as in LLaMA-Factory)."""
    model_inputs = {column: [] for column in FEEDBACK_COLUMNS}
    responses = examples["_response"]
    kl_responses = responses[-1:] + responses[:-1]  # each prompt with the previous row's answer
    batch_skipped = Counter()
    count = len(examples["_prompt"])
    systems = examples.get("_system") or [None] * count
    tools = examples.get("_tools") or [None] * count
    paths = []
    rows = zip(examples["_prompt"], responses, kl_responses, systems, tools)
    for index, (prompt, response, kl_response, system, tool_text) in enumerate(rows):
        try:
            check_preference_example(prompt, response, system, tool_text)
            check_preference_example(prompt, kl_response, system, tool_text)
            answers = [tagged_answer(response)[0], tagged_answer(kl_response)[0]]
            row_paths, opened, sides = media_sides(media, examples, index, prompt, answers)
            # PaliGemma's image prefix is kept whole within cutoff_len (LLaMA-Factory counts it in the prompt)
            budget = data_args.cutoff_len - (media.prefix_length(opened) if opened else 0)
            row = encode_feedback_example(
                prompt, response, kl_response, system, tool_text, template, tokenizer, budget, sides
            )
            for prefix in ("", "kl_"):
                ids, labels = finish_media(media, opened, row[f"{prefix}input_ids"], row[f"{prefix}labels"], row_paths)
                row[f"{prefix}input_ids"], row[f"{prefix}labels"] = ids, labels
        except SkippedExample as skip:
            batch_skipped[skip.reason] += 1
            continue
        for column in FEEDBACK_COLUMNS:
            model_inputs[column].append(row[column])
        paths.append(row_paths)
    report_skips("KTO", batch_skipped, count, skipped)
    model_inputs.update(media_columns(paths, media_kinds))
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

        names = ("input_ids", "attention_mask", "labels")
        media = [{key: feature[key] for key in MEDIA_KEYS if key in feature} for feature in features]
        batch = self.pad([{**{n: f[n] for n in names}, **m} for f, m in zip(features, media)])
        kl = self.pad([{**{n: f[f"kl_{n}"] for n in names}, **m} for f, m in zip(features, media)])
        # the KL rows are scored with the target rows' media tensors (LLaMA-Factory's KTO forward)
        batch.update({f"kl_{name}": kl[name] for name in names})
        batch.update(
            {
                f"kl_{name}": kl[name]
                for name in ("token_type_ids", "cross_attention_mask", "position_ids")
                if name in kl
            }
        )
        batch["kto_tags"] = torch.tensor([bool(feature["kto_tags"]) for feature in features])
        return batch
