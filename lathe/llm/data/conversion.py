"""A whole dataset through the converters (converters.py, and ranking.py for preference answers: convert_example
dispatches over both, so it lives above them, here): a batched `datasets.map` cached under a
fingerprint of the converters' code, and the malformed rows counted, located and skipped."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from lathe.llm.data import converters
from lathe.llm.data.converters import (
    CANONICAL_COLUMNS,
    CONVERTERS,
    EXAMPLES_SHOWN,
    MULTIMODAL,
    PROBLEM_COLUMN,
    ConversionReport,
    RowProblem,
)
from lathe.llm.data.files import decode_json_columns
from lathe.llm.data.ranking import preference_answers
from lathe.llm.data.registry import DatasetAttr
from lathe.llm.multimodal.media import CANONICAL, MediaProblem, row_media

logger = logging.getLogger("lathe.llm.data")
EXTRA = "extra:"  # the kept columns' names while converting


MEDIA_COLUMNS = tuple(CANONICAL.values())


def convert_example(
    example: dict[str, Any],
    attr: DatasetAttr,
    require_response: bool,
    prompts_only: bool = False,
    media_dir: str | None = None,
) -> dict[str, Any]:
    """One row -> canonical row plus `_problem` ("" when the row is usable, else "kind\\tdetail"), and its media
    paths (`_images`, `_videos`, `_audios`: joined to media_dir) when the entry names media columns.
    prompts_only (stage grpo): a conversation may end with the user's turn, the prompt of what is sampled."""
    empty = {"_prompt": [], "_response": [], "_system": "", "_tools": ""}
    try:
        if prompts_only and attr.formatting != "alpaca":
            example = _answer_placeholder(example, attr)
        row = CONVERTERS[attr.formatting](example, attr)
        if attr.ranking or attr.kto_tag:
            row["_response"] = preference_answers(row, example, attr)
        if require_response and len(row["_response"]) != 1:
            raise RowProblem(
                "missing response", f"column '{attr.response}' (response) is empty: supervised training needs an answer"
            )
        columns = {"image": attr.images, "video": attr.videos, "audio": attr.audios}
        if any(columns.values()):
            row.update(row_media(example, columns, media_dir, row["_prompt"] + row["_response"][:1]))
    except RowProblem as problem:
        return {**empty, PROBLEM_COLUMN: f"{problem.kind}\t{problem}"}
    except MediaProblem as problem:
        return {**empty, PROBLEM_COLUMN: f"{MULTIMODAL}\t{problem}"}
    return {**row, PROBLEM_COLUMN: ""}


def _answer_placeholder(example: dict[str, Any], attr: DatasetAttr) -> dict[str, Any]:
    """A conversation ending with a user turn gets an empty answer, so the converters (which want one, as
    LLaMA-Factory's) split it into the whole conversation as the prompt and an answer nobody reads."""
    messages = example.get(attr.messages)
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return example  # the converter names what is wrong
    roles = {attr.user_tag, attr.observation_tag}
    if messages[-1].get(attr.role_tag) not in roles:
        return example
    answer = {attr.role_tag: attr.assistant_tag, attr.content_tag: ""}
    return {**example, attr.messages: [*messages, answer]}


@dataclass
class ConvertBatch:
    """The batched `datasets.map` function (a plain object, so `datasets` can hash it for its cache)."""

    attr: DatasetAttr
    require_response: bool
    json_columns: tuple[str, ...] = ()  # columns the reader stored as JSON text (files.py)
    extras: tuple[str, ...] | None = None  # stage grpo: prompts, and these columns kept beside the canonical ones
    media_dir: str | None = None  # media paths are relative to it

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        size = len(next(iter(batch.values()))) if batch else 0
        batch = decode_json_columns(batch, self.json_columns)
        rows = [
            convert_example(
                {key: values[i] for key, values in batch.items()},
                self.attr,
                self.require_response,
                prompts_only=self.extras is not None,
                media_dir=self.media_dir,
            )
            for i in range(size)
        ]
        keys = (*CANONICAL_COLUMNS, *(MEDIA_COLUMNS if has_media(self.attr) else ()), PROBLEM_COLUMN)
        converted = {key: [row.get(key) for row in rows] for key in keys}
        # Renamed while mapping: under its own name `datasets` would cast a column back to its input type (the
        # JSON columns' text); convert_dataset renames them back.
        return {**converted, **{f"{EXTRA}{key}": batch[key] for key in self.extras or ()}}


def _conversion_fingerprint(
    dataset, attr: DatasetAttr, require_response: bool, json_columns=(), extras=None, media_dir: str | None = None
) -> str:
    """`datasets` caches the conversion under this name. Its own fingerprint of a function does not see
    the code that function calls, so a fixed converter would keep serving old rows: hash this file,
    converters.py and ranking.py (which converts preference answers) too."""
    fields = {key: value for key, value in vars(attr).items() if key != "info_path"}
    code = b""
    here = os.path.dirname(__file__)
    media = os.path.join(here, "..", "multimodal", "media.py")
    for path in (__file__, converters.__file__, os.path.join(here, "ranking.py"), media):
        with open(path, "rb") as handle:
            code += handle.read()
    parts = [dataset._fingerprint, fields, require_response, list(json_columns), extras, media_dir]
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(code + text.encode()).hexdigest()[:32]


def other_columns(attr: DatasetAttr, columns: list[str]) -> list[str]:
    """The columns of a file that no registry role reads into the prompt (system, tools and history included)."""
    roles = ("prompt", "query", "history") if attr.formatting == "alpaca" else ("messages",)
    used = {getattr(attr, role) for role in (*roles, "system", "tools")}
    return [column for column in columns if column not in used]


def has_media(attr: DatasetAttr) -> bool:
    """Whether the entry names media columns: only then do its rows carry `_images` / `_videos` / `_audios`."""
    return bool(attr.images or attr.videos or attr.audios)


def add_media_columns(dataset):
    """A text dataset given the (empty) media columns, to be merged with one that has media."""

    features = canonical_features(media=True)
    for column in MEDIA_COLUMNS:
        if column not in dataset.column_names:
            dataset = dataset.add_column(column, [None] * len(dataset), feature=features[column])
    return dataset


HELD_MEDIA = {"bytes": "binary", "path": "string"}  # datasets' Image / Audio storage: the file held in the row


def media_held_in_rows(dataset, attr: DatasetAttr):
    """(dataset, whether its media columns hold the files themselves): a column of datasets' Image / Audio
    features (or of {"bytes", "path"} structs, or bytes) is cast so its items come as {"bytes", "path"} dicts,
    undecoded, which the family plugin opens as LLaMA-Factory opens them."""
    import datasets

    held = False
    for column in (attr.images, attr.videos, attr.audios):
        feature = dataset.features.get(column) if column else None
        inner = getattr(feature, "feature", None)
        inner = feature[0] if isinstance(feature, list) and feature else inner if inner is not None else feature
        if isinstance(inner, (datasets.Image, datasets.Audio)):
            kind = type(inner)
            dataset = dataset.cast_column(column, datasets.List(kind(decode=False)))
            held = True
        elif isinstance(inner, dict) or getattr(inner, "dtype", "") in ("binary", "large_binary"):
            held = True
    return dataset, held


def canonical_features(media: bool = False, held: bool = False):
    import datasets

    message = {"role": datasets.Value("string"), "content": datasets.Value("string")}
    media_item = {key: datasets.Value(kind) for key, kind in HELD_MEDIA.items()} if held else datasets.Value("string")
    return datasets.Features(
        {
            "_prompt": datasets.List(message),
            "_response": datasets.List(message),
            "_system": datasets.Value("string"),
            "_tools": datasets.Value("string"),
            **({column: datasets.List(media_item) for column in MEDIA_COLUMNS} if media else {}),
            PROBLEM_COLUMN: datasets.Value("string"),
        }
    )


def convert_dataset(
    dataset,
    attr: DatasetAttr,
    require_response: bool,
    locate: Callable[[list[int]], list[str]],
    num_proc: int | None = None,
    load_from_cache_file: bool | None = None,
    json_columns: tuple[str, ...] = (),
    prompts_only: bool = False,
    media_dir: str | None = None,
):
    """Convert a loaded dataset to the canonical schema; returns (dataset, ConversionReport).
    prompts_only (stage grpo): conversations may end with the user's turn, and the columns no registry role
    reads stay beside the canonical ones (for the reward functions; alpaca's `response` column is one of them).

    Malformed rows are skipped and counted; `locate(positions)` names their file and row. Zero usable rows
    is an error that quotes the first problems. `json_columns` hold each value as JSON text (files.py)."""
    import pyarrow.compute as compute

    report = ConversionReport(attr.name, total=len(dataset))
    if len(dataset) == 0:
        raise ValueError(f"{attr.where()}: the data file(s) hold no rows.")
    extras = tuple(other_columns(attr, dataset.column_names)) if prompts_only else None
    if extras and set(extras) & set(CANONICAL_COLUMNS):
        names = ", ".join(sorted(set(extras) & set(CANONICAL_COLUMNS)))
        raise ValueError(f"{attr.where('columns')}: column(s) {names} have the names of lathe's converted columns.")
    dataset, held = media_held_in_rows(dataset, attr) if has_media(attr) else (dataset, False)
    converted = dataset.map(
        ConvertBatch(attr, require_response, tuple(json_columns), extras, media_dir),
        batched=True,
        remove_columns=dataset.column_names,
        # the extra columns' types are the file's
        features=None if prompts_only else canonical_features(has_media(attr), held),
        num_proc=num_proc,
        load_from_cache_file=load_from_cache_file,
        desc=f"Converting {attr.name} ({attr.formatting})",
        new_fingerprint=_conversion_fingerprint(dataset, attr, require_response, json_columns, extras, media_dir),
    )
    if extras:
        converted = converted.rename_columns({f"{EXTRA}{key}": key for key in extras})
    problems = converted.with_format("arrow")[PROBLEM_COLUMN]
    bad = compute.indices_nonzero(compute.not_equal(problems, "")).to_pylist()
    if bad:
        kinds = [problems[i].as_py().split("\t", 1) for i in bad]
        report.skipped = len(bad)
        report.reasons = Counter(kind for kind, _ in kinds)
        places = locate(bad[:EXAMPLES_SHOWN])
        report.examples = [f"{place}: {detail}" for place, (_, detail) in zip(places, kinds)]
        media = [i for i, (kind, _) in zip(bad, kinds) if kind == MULTIMODAL]
        if media:  # not a malformed row to skip: the data set is multimodal
            (place,), detail = locate(media[:1]), problems[media[0]].as_py().split("\t", 1)[1]
            raise ValueError(
                f"{attr.where()}: {place}: {detail} ({len(media)} row(s) with image, video or audio problems)"
            )
        if report.skipped == report.total:
            raise ValueError(f"{attr.where()}: no usable rows. " + report.summary())
        logger.warning(report.summary())
        keep = compute.indices_nonzero(compute.equal(problems, "")).to_pylist()
        converted = converted.select(keep)
    return converted.remove_columns(PROBLEM_COLUMN), report
