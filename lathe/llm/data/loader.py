"""Loading registered datasets: their files' rows (files.py), `num_samples` / `max_samples`, conversion to the
canonical schema, mixing several datasets, and the `val_size` split.

Sampling follows LLaMA-Factory 0.9.5 draw for draw: it uses numpy's global RNG right after
`set_seed(seed)`; lathe uses one `RandomState(seed)` per `get_dataset` call, shared by the training then
the evaluation datasets in order, which gives the same indices without touching global state.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from lathe.llm.data.conversion import convert_dataset
from lathe.llm.data.converters import ConversionReport
from lathe.llm.data.files import file_row_counts, file_split, read_files
from lathe.llm.data.registry import DatasetAttr

logger = logging.getLogger("lathe.llm.data")

INTERLEAVE_STRATEGIES = {
    "interleave_under": "first_exhausted",
    "interleave_over": "all_exhausted",
    "interleave_once": "all_exhausted_without_replacement",
}


def sample_rows(
    num_rows: int, num_samples: int | None, max_samples: int | None, rng: np.random.RandomState
) -> np.ndarray | None:
    """Row positions kept by `num_samples` then `max_samples`; None means every row in order.

    num_samples: a random permutation cut to that many; when it asks for more rows than there are, every
    row once plus random picks with replacement. max_samples: the first rows of what is left.
    """
    rows = None
    if num_samples is not None:
        rows = rng.permutation(num_rows)[:num_samples]
        if num_samples > len(rows):
            rows = np.concatenate((rows, rng.choice(num_rows, num_samples - len(rows))), axis=0)
    if max_samples is not None:
        current = num_rows if rows is None else len(rows)
        if max_samples < current:
            rows = np.arange(max_samples) if rows is None else rows[:max_samples]
    return rows


def row_locator(files: list[str], rows: np.ndarray | None, count_rows: Callable[[], list[int]]):
    """A function naming the file and row (1-based, within that file) of positions in the sampled dataset;
    `count_rows()` gives the rows of each file (called only when there are several files)."""

    def locate(positions: list[int]) -> list[str]:
        originals = [int(rows[p]) if rows is not None else int(p) for p in positions]
        if len(files) == 1:
            return [f"{files[0]} row {row + 1}" for row in originals]
        starts = np.cumsum([0] + count_rows())
        places = []
        for row in originals:
            index = int(np.searchsorted(starts, row, side="right") - 1)
            places.append(f"{files[index]} row {row - int(starts[index]) + 1}")
        return places

    return locate


def load_converted_dataset(
    attr: DatasetAttr,
    data_args: Any,
    require_response: bool,
    rng: np.random.RandomState,
    cache_dir: str | None = None,
    prompts_only: bool = False,
):
    """Read, sample and convert one registry entry; returns (dataset, ConversionReport).

    require_response: rows without exactly one answer are malformed (supervised training); pre-training
    and generation-only evaluation rows may have none."""
    raw = read_files(attr, data_args.dataset_dir, cache_dir)
    dataset, files = raw.dataset, raw.files
    if len(dataset) == 0:
        raise ValueError(f"{attr.where('file_name')}: {', '.join(files)} hold(s) no rows.")
    rows = sample_rows(len(dataset), attr.num_samples, data_args.max_samples, rng)
    if rows is not None:
        dataset = dataset.select(rows)
    if attr.num_samples is not None:
        logger.info("sampled %d rows from dataset '%s'", attr.num_samples, attr.name)
    _check_columns(attr, dataset.column_names, files, require_response)
    overwrite = bool(getattr(data_args, "overwrite_cache", False))
    return convert_dataset(
        dataset,
        attr,
        require_response=require_response,
        locate=row_locator(files, rows, lambda: file_row_counts(raw, file_split(attr), cache_dir)),
        num_proc=data_args.preprocessing_num_workers,
        load_from_cache_file=False if overwrite else None,
        json_columns=raw.json_columns,
        prompts_only=prompts_only,
        media_dir=getattr(data_args, "media_dir", None) or data_args.dataset_dir,
    )


def _check_columns(attr: DatasetAttr, present: list[str], files: list[str], require_response: bool) -> None:
    """Columns the entry names must exist in the files. A default column absent from the files means
    "none" (LLaMA-Factory raises KeyError), except the ones without which nothing can be trained."""
    where = f"{attr.where('columns')}, file {files[0]}" + (f" (and {len(files) - 1} more)" if len(files) > 1 else "")
    listed = ", ".join(present)
    if attr.formatting == "alpaca":
        roles = ("prompt", "query", "response", "history", "system", "tools", "chosen", "rejected", "kto_tag")
    else:
        roles = ("messages", "system", "tools", "chosen", "rejected", "kto_tag")
    roles += ("images", "videos", "audios")
    for role in roles:
        column = getattr(attr, role)
        if column and column not in present and role not in attr.implicit_columns:
            raise ValueError(f"{where}: column '{column}' ({role}) not found; the file has: {listed}.")
    if attr.formatting == "alpaca":
        if not any(getattr(attr, role) in present for role in ("prompt", "query") if getattr(attr, role)):
            names = " nor ".join(
                f"'{getattr(attr, role)}' ({role})" for role in ("prompt", "query") if getattr(attr, role)
            )
            raise ValueError(
                f"{where}: no prompt column: neither {names} is in the file, which has: {listed}. "
                f'Map yours in dataset_info.json, e.g. "columns": {{"prompt": "{present[0]}"}}.'
            )
        if require_response and (not attr.response or attr.response not in present):
            raise ValueError(
                f"{where}: supervised training needs a response column; "
                f"{repr(attr.response) if attr.response else 'none is named'} is not in the file, "
                f"which has: {listed}."
            )
    elif attr.messages not in present:
        raise ValueError(f"{where}: column '{attr.messages}' (messages) not found; the file has: {listed}.")


def merge_datasets(datasets_list: list, data_args: Any, seed: int):
    """One dataset from several: concatenated, or interleaved (datasets' stopping strategies)."""
    if len(datasets_list) == 1:
        return datasets_list[0]
    import datasets

    from lathe.llm.data.conversion import MEDIA_COLUMNS, add_media_columns

    if any(column in dataset.column_names for dataset in datasets_list for column in MEDIA_COLUMNS):
        datasets_list = [add_media_columns(dataset) for dataset in datasets_list]  # text rows beside media rows

    strategy = data_args.mix_strategy
    if strategy == "concat":
        return datasets.concatenate_datasets(datasets_list)
    if strategy in INTERLEAVE_STRATEGIES:
        return datasets.interleave_datasets(
            datasets_list,
            probabilities=data_args.interleave_probs,
            seed=seed,
            stopping_strategy=INTERLEAVE_STRATEGIES[strategy],
        )
    raise ValueError(f"mix_strategy '{strategy}' is unknown; use concat, {', '.join(INTERLEAVE_STRATEGIES)}.")


def split_validation(dataset, val_size: float, seed: int):
    """(train, validation): val_size below 1 is a fraction, from 1 up a number of rows (LLaMA-Factory
    reads 1.0 as a fraction and fails); `train_test_split` with the seed, as LLaMA-Factory."""
    size: float | int = int(val_size) if val_size >= 1 else val_size
    if isinstance(size, int) and size >= len(dataset):
        raise ValueError(f"val_size {size} leaves no training rows: the training data has {len(dataset)} rows.")
    try:
        parts = dataset.train_test_split(test_size=size, seed=seed)
    except ValueError as error:
        raise ValueError(f"val_size {val_size} cannot split {len(dataset)} training rows: {error}") from None
    return parts["train"], parts["test"]


def load_datasets(
    attrs: list[DatasetAttr],
    data_args: Any,
    stage: str,
    rng: np.random.RandomState,
    cache_dir: str | None = None,
    generate: bool = False,
) -> tuple[dict[str, Any], list[ConversionReport]]:
    """{name: canonical dataset} for registry entries, in order, and their conversion reports.

    Supervised rows need an answer, except evaluation rows that are generated from (`generate`), which
    may have none, as in LLaMA-Factory. Stage grpo keeps every column no role reads (for the reward functions)."""
    from lathe.llm.data.ranking import check_stage_data

    loaded, reports = {}, []
    for attr in attrs:
        check_stage_data(attr, stage)
        if attr.name in loaded:
            logger.warning("dataset '%s' is listed more than once; it is used once (as in LLaMA-Factory).", attr.name)
            continue
        require_response = stage == "sft" and not generate
        dataset, report = load_converted_dataset(attr, data_args, require_response, rng, cache_dir, stage == "grpo")
        loaded[attr.name] = dataset
        reports.append(report)
    return loaded, reports
