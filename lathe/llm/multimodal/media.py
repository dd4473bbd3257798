"""A data row's media columns (images / videos / audios in dataset_info.json) -> the canonical `_images`,
`_videos`, `_audios` lists: paths joined to media_dir as LLaMA-Factory's converter joins them (bytes and images
held in the row pass as they are), and checked per row
(a URL, a missing file, a placeholder count that differs from the media) with one line naming the row."""

from __future__ import annotations

import os
from typing import Any

from lathe.llm.multimodal.base import KINDS, PLACEHOLDERS

COLUMNS = {"image": "images", "video": "videos", "audio": "audios"}
CANONICAL = {kind: f"_{column}" for kind, column in COLUMNS.items()}


class MediaProblem(ValueError):
    """A row whose media cannot train: the run stops with the row named (never a silently dropped image)."""


def resolve_path(item: Any, media_dir: str | None, kind: str) -> Any:
    """LLaMA-Factory's rule: media_dir/item when that file exists, else the path as written (which must exist).
    Media held in the row itself pass as they are, as LLaMA-Factory takes them: bytes, {"bytes", "path"} (how
    datasets' Image / Audio features store a file in parquet and arrow; a dict without bytes is its path), and
    a decoded PIL image."""
    if isinstance(item, dict):  # the row's column holds files: every item stays a {"bytes", "path"} dict
        if item.get("bytes") is not None:
            return {"bytes": item["bytes"], "path": item.get("path")}
        return {"bytes": None, "path": resolve_path(item.get("path"), media_dir, kind)}
    if isinstance(item, (bytes, bytearray)) or type(item).__module__.startswith("PIL."):
        return item
    if not isinstance(item, str):
        raise MediaProblem(
            f"a {kind} is {type(item).__name__}: lathe reads {kind}s as file paths (relative to media_dir), bytes, "
            '{"bytes", "path"} or images'
        )
    if item.startswith(("http://", "https://", "s3://", "gs://")):
        raise MediaProblem(f"{kind} {item!r} is a URL; lathe reads no network: download it and give its path")
    joined = os.path.join(media_dir, item) if media_dir else item
    for path in (joined, item):
        if os.path.isfile(path):
            return _confined(path, kind)
    raise MediaProblem(f"{kind} file {item!r} not found (looked in media_dir {media_dir!r} and as written)")


ROOT_VARIABLE = "LATHE_MEDIA_ROOT"  # set by `lathe webui` for the runs it starts: media files stay under its root


def _confined(path: str, kind: str) -> str:
    root = os.environ.get(ROOT_VARIABLE)
    if root:
        real, real_root = os.path.realpath(path), os.path.realpath(root)
        if real != real_root and not real.startswith(real_root + os.sep):
            raise MediaProblem(f"{kind} file {path!r} is outside the web page's root {real_root} (paths stay under it)")
    return path


def count_placeholders(messages: list[dict]) -> dict[str, int]:
    return {
        kind: sum((message.get("content") or "").count(PLACEHOLDERS[kind]) for message in messages) for kind in KINDS
    }


def row_media(example: dict, columns: dict[str, str | None], media_dir: str | None, messages: list[dict]) -> dict:
    """{"_images": [...] or None, ...} for one raw row; `columns` maps kind -> the row's column name (or None).
    The placeholders of `messages` (the prompt and one answer) must match the media given, kind by kind."""
    out: dict[str, list[str] | None] = {name: None for name in CANONICAL.values()}
    if not any(columns.values()):
        return out
    given = {}
    for kind in KINDS:
        column = columns.get(kind)
        value = example.get(column) if column else None
        items = [] if value is None else (list(value) if isinstance(value, (list, tuple)) else [value])
        if kind == "video" and any(isinstance(item, (list, tuple)) for item in items):
            raise MediaProblem("a video given as a list of frame images is not supported yet: give the video file")
        given[kind] = len(items)
        out[CANONICAL[kind]] = [resolve_path(item, media_dir, kind) for item in items] or None
    found = count_placeholders(messages)
    for kind in KINDS:
        if found[kind] != given[kind]:
            raise MediaProblem(
                f"{given[kind]} {kind}(s) given but the messages hold {found[kind]} {PLACEHOLDERS[kind]} "
                f"placeholder(s); put one {PLACEHOLDERS[kind]} where each {kind} goes"
            )
    return out


def name_row(error, dataset) -> ValueError:
    """`error` (an UndecodableMedia naming its file) with the dataset row(s) whose media columns hold that file."""
    rows = []
    for column in CANONICAL.values():
        if error.file is None or column not in dataset.column_names:
            continue
        rows += [index + 1 for index, items in enumerate(dataset[column]) if items and error.file in items]
    if not rows:
        return error
    shown = ", ".join(map(str, rows[:5])) + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")
    return MediaProblem(f"dataset row {shown}: {error}")
