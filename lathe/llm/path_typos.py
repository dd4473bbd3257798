"""A path key's value that is a typo of a local folder, told apart from a hub id before any hub look-up.

`models/tni` beside a `models/` folder, `./model`, `../saves/run1` or `tiyn` beside `tiny` are meant as local
paths: reporting them as hub ids ("not on the Hub, `hf download` it") sends the user the wrong way. A name
looks local when it starts with `.` or `/`, when its first part is an existing folder, or when a folder one
edit away (a letter added, dropped, changed or two swapped) exists where it points. The report names the
deepest folder that exists and, when one is close, "did you mean ...".
"""

from __future__ import annotations

import difflib
import os

__all__ = ["local_path_problem", "folder_hint", "one_edit_apart"]

MIN_TYPO_LENGTH = 4  # shorter names are too often one edit from an unrelated folder


def one_edit_apart(a: str, b: str) -> bool:
    """Whether `b` is `a` with one letter added, dropped, changed, or two neighbours swapped (not equal)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diffs = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        if len(diffs) == 1:
            return True
        i = diffs[0]
        return len(diffs) == 2 and diffs[1] == i + 1 and a[i] == b[i + 1] and a[i + 1] == b[i]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((i for i, (x, y) in enumerate(zip(short, long)) if x != y), len(short))
    return short[i:] == long[i + 1 :]


def _folders(where: str) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(where or ".") if entry.is_dir())
    except OSError:
        return []


def _closest(parent: str, part: str, rest: list[str]) -> str | None:
    """A folder in `parent` one edit from `part` under which `rest` exists (the whole corrected path)."""
    for name in _folders(parent):
        candidate = os.path.join(parent, name, *rest)
        if one_edit_apart(part, name) and os.path.isdir(candidate):
            return candidate
    return None


def local_path_problem(name: str) -> str | None:
    """Why `name` (not an existing folder) is a missing local folder, with "did you mean"; None when it does
    not look like a local path (then it may be a hub id)."""
    found = _missing_part(name)
    if found is None:
        return None
    index, parent, part, hint = found
    # Local: written as a path, under a folder that exists (models/tni), or a folder one edit away (modles/x).
    if not (name.startswith((".", os.sep, "~")) or index > 0 or hint.startswith("; did you mean")):
        return None
    where = f"{parent!r} has no folder {part!r}" if parent else f"there is no folder {part!r} here"
    return f"is not a local folder: {where} (in {os.getcwd()}){hint}"


def folder_hint(name: str) -> str:
    """ "; did you mean 'x'?" naming the existing folder closest to the missing folder `name`; "" when none is."""
    found = _missing_part(name)
    return found[3] if found else ""


def _missing_part(name: str) -> tuple[int, str, str, str] | None:
    """(index, the deepest existing folder, its missing child, the hint) for a path that is not a folder."""
    if not name or os.path.isdir(name):
        return None
    path = os.path.expanduser(name)
    parts = [part for part in path.split(os.sep) if part not in ("", ".")]
    parent = os.sep if path.startswith(os.sep) else ""
    for index, part in enumerate(parts):
        here = os.path.join(parent, part) if parent else part
        if os.path.isdir(here):
            parent = here
            continue
        fix = _closest(parent, part, parts[index + 1 :]) if len(part) >= MIN_TYPO_LENGTH else None
        if fix is None:
            close = difflib.get_close_matches(part, _folders(parent), n=1, cutoff=0.5)
            fix = os.path.join(parent, close[0]) if close and index > 0 else None
        return index, parent, part, f"; did you mean {fix!r}?" if fix else ""
    return None
