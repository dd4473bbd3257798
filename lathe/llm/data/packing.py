"""Packed sft rows: encoded examples packed into rows of at most cutoff_len tokens that train exactly like
the examples one by one.

Each example is encoded by `encode_supervised_example` (same masking and truncation as unpacked rows) and
the examples of a preprocessing batch are packed with LLaMA-Factory 0.9.5's greedy knapsack (each row is
filled by repeatedly taking the longest example that still fits), so a row never splits an example and
the packing is deterministic. Every row carries `position_ids` restarting at 0 per example; from them the
collator (collator.py) builds attention that cannot cross examples. `attention_mask` is 1 everywhere, or,
with `neat_packing`, LLaMA-Factory's segment index: 1 for the row's first example, 2 for the second, ...

Differences from LLaMA-Factory, for packed loss == unpacked loss:
- The first label of every packed example is -100. A causal LM predicts label t from token t - 1, so in a
  packed row that label would be predicted from the previous example's last token; unpacked, an example's
  first label is never predicted at all. (It only matters with train_on_prompt, or a template whose
  first token is trained.)
- Rows are not padded to cutoff_len + 1 here and cutoff_len is not lowered by one: the collator pads.

Rows with media (a multimodal template) pack the same way: each packed row lists its examples' images (videos,
audios) in order, and the collator computes Qwen2-VL's mrope positions per example (docs/MULTIMODAL_TRAINING.md).
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter, defaultdict

from lathe.llm.data.supervised import encode_supervised_examples, report_skips
from lathe.llm.data.truncation import row_columns
from lathe.train.data.labels import IGNORE_INDEX

logger = logging.getLogger("lathe.llm.data")


def greedy_knapsack(lengths: list[int], capacity: int) -> list[list[int]]:
    """Pack items of `lengths` into bins of `capacity`; returns the item indices of each bin, in order.

    LLaMA-Factory's algorithm, item for item: sort the lengths; fill one bin at a time by taking the
    longest remaining item that fits, until none fits. Among items of equal length the one seen last
    is taken first (LLaMA-Factory pops from the end of its per-length list). Items longer than
    `capacity` raise ValueError."""
    if any(length > capacity for length in lengths):
        raise ValueError(f"an item of length {max(lengths)} does not fit in a bin of {capacity}")
    by_length: dict[int, list[int]] = defaultdict(list)
    for index, length in enumerate(lengths):
        by_length[length].append(index)
    remaining = sorted(lengths)
    bins = []
    while remaining:
        free, current = capacity, []
        while True:
            position = bisect.bisect(remaining, free) - 1  # the longest item <= free
            if position < 0:
                break
            length = remaining.pop(position)
            free -= length
            current.append(by_length[length].pop())
        bins.append(current)
    return bins


def pack_examples(
    encoded: list[tuple[list[int], list[int]]],
    cutoff_len: int,
    neat_packing: bool = False,
    cuts: list | None = None,
    paths: list[dict] | None = None,
    media_kinds: tuple = (),
) -> dict:
    """(input_ids, labels) pairs -> packed rows: input_ids, attention_mask, position_ids, labels; with
    `cuts` (an ExampleCut per pair) also truncation.COLUMNS summed over each row's examples; with `media_kinds`,
    each row's media columns: its examples' items in the row's order (`paths`: each pair's media, kind -> items),
    as LLaMA-Factory concatenates them."""
    rows = {"input_ids": [], "attention_mask": [], "position_ids": [], "labels": []}
    bins = greedy_knapsack([len(input_ids) for input_ids, _ in encoded], cutoff_len)
    for members in bins:
        input_ids, attention_mask, position_ids, labels = [], [], [], []
        for segment, index in enumerate(members, start=1):
            example_ids, example_labels = encoded[index]
            input_ids += example_ids
            attention_mask += [segment if neat_packing else 1] * len(example_ids)
            position_ids += range(len(example_ids))
            labels += [IGNORE_INDEX] + example_labels[1:]  # never predicted from the previous example
        rows["input_ids"].append(input_ids)
        rows["attention_mask"].append(attention_mask)
        rows["position_ids"].append(position_ids)
        rows["labels"].append(labels)
    if cuts is not None:
        rows.update(row_columns([[cuts[index] for index in members] for members in bins]))
    if media_kinds:
        from lathe.llm.multimodal.encode import output_columns

        joined = [
            {kind: [item for index in members for item in (paths[index].get(kind) or [])] for kind in media_kinds}
            for members in bins
        ]
        rows.update(output_columns(joined, media_kinds))
    return rows


def preprocess_packed_supervised_dataset(
    examples: dict,
    template,
    tokenizer,
    data_args,
    skipped: Counter | None = None,
    measure: bool = False,
    media=None,
    media_kinds: tuple = (),
    notes: list | None = None,
) -> dict:
    """A batched `datasets.map` function: canonical columns -> packed rows (input_ids, attention_mask,
    position_ids, labels). Skipped examples are counted and logged as for unpacked rows; `measure` adds
    truncation.COLUMNS per packed row; `media` (a MediaEncoder) expands the rows' media as for unpacked rows, and
    each packed row carries its examples' media columns (`media_kinds`) in order; `notes` as for unpacked rows."""
    cuts: list = []
    paths: list[dict] = []
    encoded, batch_skipped = encode_supervised_examples(
        examples, template, tokenizer, data_args, cuts, media, paths, notes
    )
    report_skips("Packed supervised", batch_skipped, len(examples["_prompt"]), skipped)
    return pack_examples(
        encoded,
        data_args.cutoff_len,
        getattr(data_args, "neat_packing", False),
        cuts if measure else None,
        paths,
        media_kinds,
    )
