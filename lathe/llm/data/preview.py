"""What `lathe data preview` prints: a few tokenized examples decoded, with the trained spans marked,
and the fraction of tokens that are trained. Pairwise rows (rm, dpo) show the chosen and the rejected
sequence; KTO rows the tagged answer and the mismatched pair of the KL term."""

from __future__ import annotations

import re
from typing import Any

from lathe.train.data.labels import IGNORE_INDEX

OPEN, CLOSE = "[[", "]]"
# A run of one special token (an image's <|image_pad|> x 64): shown once with its count, "<|image_pad|>x64".
REPEATED_SPECIAL = re.compile(r"(<[^<>\s]{1,40}>)\1{3,}")


def collapse_repeats(text: str) -> str:
    """Media runs shortened to their token and count, so the text around an image stays readable."""
    return REPEATED_SPECIAL.sub(lambda match: f"{match.group(1)}x{len(match.group(0)) // len(match.group(1))}", text)


def mark_trained_spans(input_ids: list[int], labels: list[int] | None, tokenizer) -> str:
    """The decoded example with every trained span (labels != -100) between [[ and ]].

    Where a label differs from the input token at its position (templates with efficient_eos train EOS
    on the first token of the next prompt), the label is shown in the brackets before that token.
    """
    if labels is None:
        labels = list(input_ids)  # pre-training rows: every token is trained
    pieces: list[str] = []
    run: list[int] = []
    run_trained = None

    def flush():
        if run:
            text = tokenizer.decode(run, skip_special_tokens=False)
            pieces.append(f"{OPEN}{text}{CLOSE}" if run_trained else text)
            run.clear()

    for token, label in zip(input_ids, labels):
        trained = label != IGNORE_INDEX
        if trained and label != token:
            flush()
            pieces.append(f"{OPEN}{tokenizer.decode([label], skip_special_tokens=False)}{CLOSE}")
            run_trained = False
            run.append(token)
            continue
        if trained != run_trained:
            flush()
            run_trained = trained
        run.append(token)
    flush()
    return "".join(pieces)


# (input ids, labels) column pairs a row may hold: sft/pt/kto rows, and the two sides of a pairwise row.
# A KTO row's KL pair (kl_input_ids) is not trained and not counted.
SEQUENCE_COLUMNS = (
    ("input_ids", "labels"),
    ("chosen_input_ids", "chosen_labels"),
    ("rejected_input_ids", "rejected_labels"),
)


def trained_fraction(dataset) -> tuple[int, int]:
    """(trained tokens, all tokens) over the whole dataset, counted in arrow."""
    import pyarrow.compute as compute

    table = dataset.with_format("arrow")[:]
    trained = total = 0
    for ids, labels in SEQUENCE_COLUMNS:
        if ids not in table.column_names:
            continue
        tokens = int(compute.sum(compute.list_value_length(table[ids])).as_py() or 0)
        total += tokens
        if labels not in table.column_names:
            trained += tokens
            continue
        flat = compute.list_flatten(table[labels])
        trained += int(compute.sum(compute.not_equal(flat, IGNORE_INDEX)).as_py() or 0)
    return trained, total


def preview_examples(dataset, tokenizer, n: int = 3) -> str:
    """A report of the first `n` rows of a tokenized dataset and the trained-token fraction of all rows."""
    trained, total = trained_fraction(dataset)
    share = trained / total if total else 0.0
    lines = [
        f"{len(dataset)} examples, {total} tokens, {trained} trained ({share:.1%}); "
        f"trained spans are shown between {OPEN} and {CLOSE}."
    ]
    if "images" in dataset.column_names or "videos" in dataset.column_names or "audios" in dataset.column_names:
        lines.append(
            "media tokens (<|image_pad|>, ...) stand where the row's media go, a run of them shown as the token and "
            "its count (<|image_pad|>x64); they are never trained."
        )
    for index in range(min(n, len(dataset))):
        row: dict[str, Any] = dataset[index]
        if "chosen_input_ids" in row:
            lines.append(f"--- example {index + 1}")
            for side in ("chosen", "rejected"):
                lines += _sequence(f"{side}:", row[f"{side}_input_ids"], row[f"{side}_labels"], tokenizer)
        elif "kto_tags" in row:
            tag = "desirable" if row["kto_tags"] else "undesirable"
            lines.append(f"--- example {index + 1}")
            lines += _sequence(f"{tag} answer:", row["input_ids"], row["labels"], tokenizer)
            lines += _sequence(
                "KL pair (the previous row's answer, scored but not trained):",
                row["kl_input_ids"],
                row["kl_labels"],
                tokenizer,
                counted="scored",
            )
        else:
            lines += _sequence(f"--- example {index + 1}:", row["input_ids"], row.get("labels"), tokenizer)
        media = [f"{kind}: {', '.join(row[kind])}" for kind in ("images", "videos", "audios") if row.get(kind)]
        if media:
            lines.append("media " + "; ".join(media))
    return "\n".join(lines)


def _sequence(
    title: str, input_ids: list[int], labels: list[int] | None, tokenizer, counted: str = "trained"
) -> list[str]:
    trained = sum(label != IGNORE_INDEX for label in labels) if labels is not None else len(input_ids)
    return [
        f"{title} {len(input_ids)} tokens, {trained} {counted} ({trained / max(len(input_ids), 1):.1%})",
        collapse_repeats(mark_trained_spans(input_ids, labels, tokenizer)),
    ]
