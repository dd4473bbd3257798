"""Images named by a data row: read (paths relative to media_dir, never fetched from the network), resized
into the configured pixel budget as LLaMA-Factory does for every family, and counted against the `<image>`
placeholders of the conversation."""

from __future__ import annotations

import math
import os
from io import BytesIO
from typing import Any

IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, AUDIO_PLACEHOLDER = "<image>", "<video>", "<audio>"
DEFAULT_IMAGE_MAX_PIXELS, DEFAULT_IMAGE_MIN_PIXELS = 768 * 768, 32 * 32  # LLaMA-Factory's defaults


def _pil():
    try:
        from PIL import Image
    except ImportError as error:  # pragma: no cover - Pillow comes with transformers' vision extra
        raise ImportError("image data needs Pillow: pip install pillow") from error
    return Image


def open_image(item: Any, media_dir: str | None = None, where: str = "image"):
    """A PIL image from what a row holds: a PIL image, a path (relative to media_dir), bytes, or a
    {"bytes": ..., "path": ...} dict as datasets stores images. URLs are refused: lathe reads no network."""
    Image = _pil()
    if isinstance(item, Image.Image):
        return item
    if isinstance(item, dict):
        if item.get("bytes") is not None:
            return _decoded(Image, BytesIO(item["bytes"]), where, item.get("path"))
        item = item.get("path")
    if isinstance(item, bytes):
        return _decoded(Image, BytesIO(item), where)
    if not isinstance(item, str):
        raise ValueError(f"{where}: expected an image path, bytes or image, got {type(item).__name__}")
    if item.startswith(("http://", "https://")):
        raise ValueError(f"{where}: {item!r} is a URL; lathe reads no network: download it and give its path")
    path = item if os.path.isabs(item) or media_dir is None else os.path.join(media_dir, item)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{where}: image file {path!r} not found")
    return _decoded(Image, path, where)


class UndecodableMedia(ValueError):
    """A media file that cannot be decoded (truncated, damaged, not an image); `file` names it, for the row."""

    def __init__(self, message: str, file: str | None = None):
        super().__init__(message)
        self.file = file


def _decoded(Image, source, where: str, file: str | None = None):
    """Open and decode now (PIL decodes lazily: a truncated file would fail later, far from its name)."""
    file = file or (source if isinstance(source, str) else None)
    try:
        image = Image.open(source)
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        what = f"image file {file!r}" if file else "image bytes"
        raise UndecodableMedia(f"{where}: {what} cannot be decoded ({error}).", file) from None
    return image


def fit_pixels(image, max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS, min_pixels: int = DEFAULT_IMAGE_MIN_PIXELS):
    """Scale the image (aspect kept, sides truncated to integers) into [min_pixels, max_pixels] and make it RGB,
    as LLaMA-Factory does before any family's image processor runs."""
    for limit, too_far in ((max_pixels, lambda area: area > max_pixels), (min_pixels, lambda area: area < min_pixels)):
        area = image.width * image.height
        if too_far(area):
            factor = math.sqrt(limit / area)
            image = image.resize((int(image.width * factor), int(image.height * factor)))
    return image if image.mode == "RGB" else image.convert("RGB")


def check_placeholders(messages: list[dict], counts: dict[str, int], where: str) -> None:
    """The number of `<image>` / `<video>` / `<audio>` placeholders in the messages must equal the number
    of media of each kind the row gives; otherwise one line naming the row."""
    for placeholder, kind in ((IMAGE_PLACEHOLDER, "image"), (VIDEO_PLACEHOLDER, "video"), (AUDIO_PLACEHOLDER, "audio")):
        found = sum(message["content"].count(placeholder) for message in messages)
        given = counts.get(kind, 0)
        if found != given:
            raise ValueError(
                f"{where}: {given} {kind}(s) given but the messages hold {found} {placeholder} placeholder(s); "
                f"put one {placeholder} where each {kind} goes"
            )


def media_cut_reason(
    input_ids: list[int], start_id: int, end_id: int, pad_id: int, token_counts: list[int]
) -> str | None:
    """Why an encoded row cannot train after cutoff, or None: every media run (start, `token_counts[k]` pads,
    end) must be whole and every medium present. LLaMA-Factory keeps a run cut by cutoff_len, and the model then
    stops on features that do not match their tokens; lathe leaves such a row out and counts the reason (the
    data report's skips, lathe.llm.data.supervised.SkippedExample)."""
    runs, index = [], 0
    while index < len(input_ids):
        if input_ids[index] != start_id:
            index += 1
            continue
        end = index + 1
        while end < len(input_ids) and input_ids[end] == pad_id:
            end += 1
        whole = end < len(input_ids) and input_ids[end] == end_id
        runs.append((end - index - 1, whole))
        index = end + 1
    for number, expected in enumerate(token_counts):
        if number >= len(runs):
            return f"cutoff_len cuts off media {number + 1} of {len(token_counts)} (its {expected} tokens)"
        count, whole = runs[number]
        if not whole or count != expected:
            return (
                f"cutoff_len cuts through media {number + 1} of {len(token_counts)} ({count} of its {expected} tokens)"
            )
    return None
