"""Which rows cutoff_len cut through their media (left out: the model cannot read a cut media run) and which it left
with no trained token (kept, as LLaMA-Factory keeps them): noted per row while tokenizing, kept in the cache entry's
manifest ("row_notes" in each split's stats), listed by `lathe data preview`.

A note is {"row": the row's index in its split before tokenizing (0-based), "kept": bool, "why": text}. Notes are
collected in the tokenizing process: with preprocessing_num_workers > 1 the workers' notes do not come back and the
manifest records none (the data report's counts still cover every row).
"""

from __future__ import annotations

from collections.abc import Callable

LIMIT = 1000  # notes kept per split: the manifest stays small; the counts in the data report cover every row


def untrained_why(cut, cutoff_len: int) -> str:
    """Why a kept row has no trained token (cut: its truncation.ExampleCut)."""
    if cut is None or cut.labels_before == 0:
        return "kept with no trained token: its answer has none (an empty answer, or every label masked)"
    return (
        f"kept with no trained token: cutoff_len={cutoff_len} keeps {cut.tokens_after} of its {cut.tokens_before} "
        f"tokens and none of its {cut.labels_before} answer tokens"
    )


def media_cut_why(reason: str, cut, cutoff_len: int, files: list[str]) -> str:
    """Why a row was left out: the media run cutoff_len cut (reason: the family plugin's cut_reason)."""
    length = f", {cut.tokens_before} tokens before the cut" if cut is not None else ""
    named = f"; media {', '.join(files)}" if files else ""
    return f"left out: {reason} (cutoff_len={cutoff_len}{length}){named}"


def with_row_notes(function: Callable, notes: list) -> Callable:
    """`function` (a processor bound to its arguments, taking `notes`) as a datasets.map function `with_indices`:
    each note's position in the batch becomes the row's index in the split; the first LIMIT notes go to `notes`."""

    def mapped(examples, indices):
        batch_notes: list[dict] = []
        output = function(examples, notes=batch_notes)
        for note in batch_notes:
            if len(notes) < LIMIT:
                notes.append({**note, "row": int(indices[note["row"]])})
        return output

    return mapped


def describe_row_notes(notes: list[dict] | None, split: str, media: bool = True) -> str:
    """The preview's list: the rows left out for a cut media run (shown when the split has `media` or such rows),
    then the rows kept with no trained token."""
    if notes is None:
        return (
            f"Rows cut through media / kept with no trained token ({split}): not recorded (the data was tokenized by "
            "several workers, or by an older lathe: set overwrite_cache: true and preprocessing_num_workers: null)."
        )
    left_out = [note for note in notes if not note["kept"]]
    untrained = [note for note in notes if note["kept"]]
    lines = [f"Rows cutoff_len cuts through media ({split}, left out): {len(left_out) or 'none'}"]
    lines = lines if media or left_out else []
    lines += [f"  row {note['row']}: {note['why']}" for note in left_out]
    lines.append(f"Rows kept with no trained token ({split}): {len(untrained) or 'none'}")
    lines += [f"  row {note['row']}: {note['why']}" for note in untrained]
    if len(notes) >= LIMIT:
        lines.append(f"  (the first {LIMIT} such rows; the data report counts them all)")
    return "\n".join(lines)
