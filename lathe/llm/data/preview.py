"""What `lathe data preview` prints: a few tokenized examples decoded, with the trained spans marked,
and the fraction of tokens that are trained."""
from __future__ import annotations

from typing import Any

IGNORE_INDEX = -100
OPEN, CLOSE = "[[", "]]"


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


def trained_fraction(dataset) -> tuple[int, int]:
    """(trained tokens, all tokens) over the whole dataset, counted in arrow."""
    import pyarrow.compute as compute

    table = dataset.with_format("arrow")[:]
    total = int(compute.sum(compute.list_value_length(table["input_ids"])).as_py() or 0)
    if "labels" not in table.column_names:
        return total, total
    labels = compute.list_flatten(table["labels"])
    return int(compute.sum(compute.not_equal(labels, IGNORE_INDEX)).as_py() or 0), total


def preview_examples(dataset, tokenizer, n: int = 3) -> str:
    """A report of the first `n` rows of a tokenized dataset and the trained-token fraction of all rows."""
    trained, total = trained_fraction(dataset)
    share = trained / total if total else 0.0
    lines = [f"{len(dataset)} examples, {total} tokens, {trained} trained ({share:.1%}); "
             f"trained spans are shown between {OPEN} and {CLOSE}."]
    for index in range(min(n, len(dataset))):
        row: dict[str, Any] = dataset[index]
        labels = row.get("labels")
        row_trained = sum(label != IGNORE_INDEX for label in labels) if labels is not None else len(row["input_ids"])
        lines.append(f"--- example {index + 1}: {len(row['input_ids'])} tokens, {row_trained} trained "
                     f"({row_trained / max(len(row['input_ids']), 1):.1%})")
        lines.append(mark_trained_spans(row["input_ids"], labels, tokenizer))
    return "\n".join(lines)
