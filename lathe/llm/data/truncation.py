"""What cutoff_len cut: per-row counts from the sft processors, summed per split, reported, and loud when
most of the trained tokens are gone.

The processors (supervised.py, packing.py) add the COLUMNS below to every row they write when asked to
measure; the pipeline sums them into the cache entry's manifest (so a cached run reports the same) and
drops them when it loads the split, so the rows the Trainer sees are unchanged. Pre-training (pt) cuts
nothing: a document longer than cutoff_len continues in the next block (or row, without packing).
The tokenizer's own "Token indices sequence length is longer than the specified maximum sequence length
... indexing errors" warning is silenced while tokenizing: lathe truncates to cutoff_len itself, so no
sequence that long ever reaches the model, and the report below says what was cut instead.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator

from lathe.train.data.labels import IGNORE_INDEX

# Per row: examples in it, examples cutoff_len shortened, tokens cut, label tokens before truncation,
# label tokens cut, and the longest example before truncation.
COLUMNS = ("_examples", "_truncated_examples", "_cut_tokens", "_label_tokens", "_cut_label_tokens", "_longest_example")
MOSTLY_CUT = 0.5  # above this share of label tokens cut, the report is a loud warning
TOKENIZER_LENGTH_WARNING = "sequence-length-is-longer-than-the-specified-maximum"


@dataclass
class ExampleCut:
    """One encoded example: its tokens and label tokens (labels != -100) before and after cutoff_len."""

    tokens_before: int
    tokens_after: int
    labels_before: int
    labels_after: int

    @property
    def truncated(self) -> bool:
        return self.tokens_after < self.tokens_before


def count_labels(labels: list[int]) -> int:
    return sum(label != IGNORE_INDEX for label in labels)


def row_columns(rows: list[list[ExampleCut]]) -> dict[str, list[int]]:
    """The COLUMNS for rows made of the given examples (one example per row unless packed)."""
    return {
        "_examples": [len(cuts) for cuts in rows],
        "_truncated_examples": [sum(cut.truncated for cut in cuts) for cuts in rows],
        "_cut_tokens": [sum(cut.tokens_before - cut.tokens_after for cut in cuts) for cuts in rows],
        "_label_tokens": [sum(cut.labels_before for cut in cuts) for cuts in rows],
        "_cut_label_tokens": [sum(cut.labels_before - cut.labels_after for cut in cuts) for cuts in rows],
        "_longest_example": [max((cut.tokens_before for cut in cuts), default=0) for cuts in rows],
    }


def split_truncation(dataset) -> dict[str, int] | None:
    """The COLUMNS of a tokenized split summed (the longest: its maximum); None when it has none (pt)."""
    if not set(COLUMNS) <= set(dataset.column_names):
        return None
    import pyarrow.compute as compute

    table = dataset.with_format("arrow").select_columns(list(COLUMNS))[:]
    totals = {name.lstrip("_"): int(compute.sum(table[name]).as_py() or 0) for name in COLUMNS}
    totals["longest_example"] = int(compute.max(table["_longest_example"]).as_py() or 0)
    return totals


def without_columns(dataset):
    """The split as the Trainer gets it: the COLUMNS dropped (no copy: a projection of the arrow file)."""
    present = [name for name in COLUMNS if name in dataset.column_names]
    return dataset.remove_columns(present) if present else dataset


@contextlib.contextmanager
def quiet_length_warning(tokenizer) -> Iterator[None]:
    """Silence transformers' warning about sequences longer than model_max_length while `tokenizer`
    tokenizes data that lathe itself cuts to cutoff_len (it would say "indexing errors", which cannot happen)."""
    flags = getattr(tokenizer, "deprecation_warnings", None)
    if not isinstance(flags, dict):
        yield
        return
    before = flags.get(TOKENIZER_LENGTH_WARNING, False)
    flags[TOKENIZER_LENGTH_WARNING] = True  # transformers warns once per tokenizer: "already warned"
    try:
        yield
    finally:
        flags[TOKENIZER_LENGTH_WARNING] = before


def dropped_rows(split: dict[str, Any] | None) -> int | None:
    """Examples of a tokenized split's stats (pipeline.split_stats) that tokenizing left out; None for pt."""
    if not split or not split.get("truncation"):
        return None
    return split["rows_before"] - split["truncation"]["examples"]


def check_dropped_rows(split: dict[str, Any] | None, data_args) -> None:
    """Stop when more than max_dropped_rows_share of the training examples were left out: rows that cannot be
    encoded, or whose media cutoff_len cuts through (LLaMA-Factory keeps those, and the model then stops on
    features that do not match their tokens). Rows left with no trained token are kept, as LLaMA-Factory keeps
    them, and are not counted here."""
    dropped = dropped_rows(split)
    limit = data_args.max_dropped_rows_share
    if not dropped or dropped <= limit * split["rows_before"]:
        return
    total = split["rows_before"]
    names = ", ".join(data_args.dataset or []) or "the training data"
    raise ValueError(
        f"tokenizing left out {dropped} of {total} training examples ({dropped / total:.1%}) of dataset "
        f"{names}: cutoff_len={data_args.cutoff_len} cuts through their media, or they are unusable (see the "
        f"warnings above). Raise cutoff_len, or set max_dropped_rows_share: {math.ceil(dropped / total * 100) / 100} "
        f"(now {limit}) to train on the {total - dropped} left."
    )


def check_cut_tokens(split: dict[str, Any] | None, data_args) -> None:
    """Stop when cutoff_len cut most of the training split's trained tokens (more than MOSTLY_CUT, and more
    than max_dropped_rows_share, the same opt-out as the rows left out): rows survive, the signal does not."""
    stats = (split or {}).get("truncation")
    if not stats or not stats["label_tokens"]:
        return
    share = stats["cut_label_tokens"] / stats["label_tokens"]
    limit = data_args.max_dropped_rows_share
    if share <= max(MOSTLY_CUT, limit):
        return
    raise ValueError(
        f"cutoff_len={data_args.cutoff_len} cuts {share:.1%} of the trained tokens of the training data "
        f"({stats['cut_label_tokens']:,} of {stats['label_tokens']:,}; longest example {stats['longest_example']:,} "
        f"tokens): raise cutoff_len (cutoff_len: {stats['longest_example']} keeps every example whole), or set "
        f"max_dropped_rows_share: {math.ceil(share * 100) / 100} (now {limit}) to train on what is left."
    )


def mostly_cut(stats: dict[str, Any]) -> bool:
    return stats["cut_label_tokens"] > MOSTLY_CUT * max(stats["label_tokens"], 1)


def summary(stats: dict[str, Any], cutoff_len: int, trained: bool = True) -> str:
    """One line: how many examples cutoff_len shortened and how many (trained) label tokens it cut."""
    what = "trained tokens" if trained else "label tokens"
    if not stats["truncated_examples"]:
        return f"no example is longer than cutoff_len {cutoff_len} (longest {stats['longest_example']:,} tokens)"
    share = stats["cut_label_tokens"] / max(stats["label_tokens"], 1)
    return (
        f"cutoff_len {cutoff_len} cut {stats['truncated_examples']:,} of {stats['examples']:,} examples "
        f"(longest {stats['longest_example']:,} tokens): {stats['cut_tokens']:,} tokens, of them "
        f"{stats['cut_label_tokens']:,} of {stats['label_tokens']:,} {what} ({share:.1%})"
    )


def advice(stats: dict[str, Any], cutoff_len: int) -> str:
    return (
        f"most of the training signal is lost: raise cutoff_len (cutoff_len: {stats['longest_example']} keeps "
        f"every example whole; it is {cutoff_len} now), or shorten the examples"
    )


def report(split: str, stats: dict[str, Any] | None, cutoff_len: int) -> tuple[str, str] | None:
    """(level, message) for the log, or None when nothing was cut. Loud when most label tokens are gone."""
    if not stats or not stats["truncated_examples"]:
        return None
    text = f"{split} split: {summary(stats, cutoff_len, trained=split == 'train')}"
    if mostly_cut(stats):
        return "warning", f"MOST TOKENS THAT SHOULD TRAIN ARE CUT. {text}; {advice(stats, cutoff_len)}."
    return "info", text + "."
