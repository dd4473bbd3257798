"""Data files -> raw rows exactly as written: text stays text, and a file that cannot be read names its line.

`datasets` infers one type per column, which changes text: JSON strings such as "887" become numbers when
the column also holds a number or a list, dates become timestamps, and CSV answers such as "5" or "None"
become floats or nulls. So lathe reads JSON and JSON Lines itself (a column holding anything but strings is
kept as JSON text per value and decoded again, value for value, when rows are converted), reads CSV through
`datasets` with every column as text and only empty cells as missing, and leaves parquet, arrow and text
files to `datasets` (their types are the file's own). Invalid UTF-8 is reported with its file, line and byte.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from lathe.llm.data.registry import DatasetAttr, resolve_data_files

READER_VERSION = "1"  # part of the raw rows' fingerprint: bump when the rows read from the same bytes change


@dataclass
class RawRows:
    """The rows of one registry entry before conversion."""

    dataset: Any  # datasets.Dataset
    files: list[str]
    builder: str
    json_columns: tuple[str, ...] = ()  # stored as JSON text per value: decode before use
    file_rows: list[int] | None = field(default=None)  # rows per file when the reader counted them


def read_files(attr: DatasetAttr, dataset_dir: str, cache_dir: str | None = None) -> RawRows:
    """The raw rows of one registry entry (every file of a folder, in name order)."""
    files, builder = resolve_data_files(attr, dataset_dir)
    split = file_split(attr)
    if builder == "json":
        if split != "train":
            raise ValueError(
                f"{attr.where('split')}: split '{attr.split}' does not exist in local files; "
                f"their rows are the 'train' split."
            )
        try:
            return read_json_files(files)
        except ValueError as error:
            raise ValueError(f"{attr.where('file_name')}: {error}") from None
    import datasets

    options: dict[str, Any] = {}
    if builder == "csv":  # every CSV cell is text; only an empty cell is missing ("NA", "None" stay text)
        options = {
            "features": datasets.Features({name: datasets.Value("string") for name in _csv_header(files)}),
            "keep_default_na": False,
            "na_values": [""],
        }
    try:
        dataset = datasets.load_dataset(builder, data_files=files, split=split, cache_dir=cache_dir, **options)
    except Exception as error:  # datasets wraps parse errors several layers deep: say where, in one line
        detail = invalid_utf8(files) if isinstance(_innermost(error), UnicodeDecodeError) else None
        raise ValueError(
            f"{attr.where('file_name')}: could not read {', '.join(files)} as {builder}: "
            f"{detail or _describe(_innermost(error))}"
        ) from error
    return RawRows(dataset, files, builder)


def file_split(attr: DatasetAttr) -> str:
    """The split to read the files as: a hub repository's files were chosen for the entry's split already."""
    return "train" if attr.snapshot is not None else attr.split


def _innermost(error: BaseException) -> BaseException:
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    return error


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _csv_header(files: list[str]) -> list[str]:
    """The column names pandas gives the first file (duplicates renamed as it does); every file must agree."""
    import pandas

    headers = []
    for path in files:
        try:
            headers.append(list(pandas.read_csv(path, nrows=0).columns))
        except UnicodeDecodeError:
            raise ValueError(invalid_utf8([path])) from None
        except Exception as error:
            raise ValueError(f"{path}: could not read the CSV header: {_describe(error)}") from None
        if headers[-1] != headers[0]:
            raise ValueError(
                f"{path} has the columns {', '.join(headers[-1])} but {files[0]} has "
                f"{', '.join(headers[0])}: the files of one dataset must share their columns."
            )
    return headers[0]


# ---- invalid UTF-8 ----------------------------------------------------------------------------------------


def invalid_utf8(files: list[str]) -> str | None:
    """Where the first byte that is not UTF-8 sits, as "FILE line L, byte B (column C): ...", or None."""
    for path in files:
        offset = 0
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, start=1):  # b"\n" never occurs inside a UTF-8 sequence
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as error:
                    return _utf8_message(
                        path, number, offset + error.start, error.start, line[error.start], error.reason
                    )
                offset += len(line)
    return None


def _utf8_message(path: str, line: int, offset: int, column: int, byte: int, reason: str) -> str:
    return (
        f"{path} line {line}, byte {offset} (column {column + 1} of the line): invalid UTF-8 "
        f"(byte 0x{byte:02x}: {reason}); data files must be UTF-8 text."
    )


def _decode(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8-sig")  # a leading byte-order mark is not part of the data
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1)
        raise ValueError(_utf8_message(path, line, error.start, column, data[error.start], error.reason)) from None


# ---- JSON and JSON Lines -------------------------------------------------------------------------------


def read_json_files(files: list[str]) -> RawRows:
    """Rows of JSON (a list of objects, one object, or a list of strings as "text" rows) and JSON Lines files,
    with every value as the file holds it. A .json file whose content is JSON Lines is read as such."""
    rows: list[dict[str, Any]] = []
    file_rows = []
    digest = hashlib.sha256(READER_VERSION.encode())
    for path in files:
        with open(path, "rb") as handle:
            data = handle.read()
        digest.update(hashlib.sha256(data).digest())
        before = len(rows)
        rows.extend(_json_rows(_decode(data, path), path))
        file_rows.append(len(rows) - before)
    if rows and not any(rows):
        raise ValueError(f"{', '.join(files)}: every row is an empty object: the data has no columns.")
    dataset, json_columns = rows_to_dataset(rows, fingerprint=digest.hexdigest()[:32])
    return RawRows(dataset, files, "json", json_columns, file_rows)


def _json_rows(text: str, path: str) -> Iterator[dict[str, Any]]:
    if path.lower().endswith(".jsonl"):
        return _json_lines(text, path)
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as error:
        first = next((line for line in text.splitlines() if line.strip()), "")
        if not _parses(first):  # not JSON Lines either: the error is in the document
            raise ValueError(f"{path} line {error.lineno} column {error.colno}: {error.msg}") from None
        return _json_lines(text, path)
    if isinstance(whole, dict):
        return iter([whole])
    if not isinstance(whole, list):
        raise ValueError(f"{path} holds a JSON {_kind(whole)}; expected a list of objects (one per row) or JSON Lines.")
    if whole and all(isinstance(item, str) for item in whole):
        return iter([{"text": item} for item in whole])  # a list of strings: one "text" row each, as `datasets`
    for number, item in enumerate(whole, start=1):
        if not isinstance(item, dict):
            raise ValueError(
                f"{path} item {number} is a {_kind(item)}; every item of the list must be an object "
                f"(one row, its keys the columns)."
            )
    return iter(whole)


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def _json_lines(text: str, path: str) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} line {number} column {error.colno}: {error.msg}") from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{path} line {number} holds a JSON {_kind(row)}; each line must be an object "
                f"(one row, its keys the columns)."
            )
        yield row


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def rows_to_dataset(rows: list[dict[str, Any]], fingerprint: str):
    """(datasets.Dataset, JSON columns): a column of strings (and nulls) stays a string column; any other
    column holds each value's JSON text, so that arrow never needs one type for values of several."""
    import datasets
    import pyarrow
    from datasets.table import InMemoryTable

    names = list(dict.fromkeys(key for row in rows for key in row))
    arrays, json_columns = [], []
    for name in names:
        values = [row.get(name) for row in rows]
        array = _string_array(values) if all(value is None or isinstance(value, str) for value in values) else None
        if array is None:
            array = _json_array(values)
            json_columns.append(name)
        arrays.append(array)
    table = pyarrow.Table.from_arrays(arrays, names=names) if names else pyarrow.table({})
    return datasets.Dataset(InMemoryTable(table), fingerprint=fingerprint), tuple(json_columns)


def _string_array(values: list[str | None]):
    import pyarrow

    try:
        return pyarrow.array(values, type=pyarrow.large_string())
    except (UnicodeEncodeError, pyarrow.ArrowException):  # a lone surrogate ("\ud800" in the file)
        return None


def _json_array(values: list[Any]):
    import pyarrow

    try:
        texts = [None if value is None else json.dumps(value, ensure_ascii=False) for value in values]
        return pyarrow.array(texts, type=pyarrow.large_string())
    except (UnicodeEncodeError, pyarrow.ArrowException):  # lone surrogates: escape them, the decoder restores them
        return pyarrow.array(
            [None if value is None else json.dumps(value) for value in values], type=pyarrow.large_string()
        )


def decode_json_columns(batch: dict[str, list[Any]], json_columns: tuple[str, ...]) -> dict[str, list[Any]]:
    """A batch of raw rows with the JSON columns turned back into the values the file holds."""
    if not json_columns:
        return batch
    decoded = dict(batch)
    for name in json_columns:
        if name in decoded:
            decoded[name] = [None if text is None else json.loads(text) for text in decoded[name]]
    return decoded


def file_row_counts(raw: RawRows, split: str, cache_dir: str | None) -> list[int]:
    """Rows per file (read again through `datasets` when the reader did not count them)."""
    if raw.file_rows is not None:
        return raw.file_rows
    if len(raw.files) == 1:
        return [len(raw.dataset)]
    import datasets

    return [
        len(datasets.load_dataset(raw.builder, data_files=[path], split=split, cache_dir=cache_dir))
        for path in raw.files
    ]
