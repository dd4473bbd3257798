"""Compare two results of bench/library_jobs.py (transformers' Trainer vs lathe's): log history, metrics,
predictions, the files of every checkpoint and of the final model, and the weights' sums. Floats within
rtol 1e-5 (atol 1e-6); timings (runtime, per-second) are not compared; lathe's own extra checkpoint file
(lathe_checkpoint.json, its completeness marker) is listed apart.

    python bench/library_compare.py HF.json LATHE.json      (exit 1 on a difference)
"""

from __future__ import annotations

import json
import math
import re
import sys

TIMING = ("runtime", "per_second", "train_runtime")
LATHE_ONLY_FILES = ("lathe_checkpoint.json", "training_args.json")
# Fields of saved JSON files that name the run's own folders or library (not numbers a user compares).
IGNORED_KEYS = ("transformers_version", "lathe_version", "_name_or_path", "best_model_checkpoint", "logging_dir")


def _dict_differences(ours: dict, theirs: dict, path: str, rtol: float, atol: float) -> list[str]:
    found = []
    for key in sorted(set(theirs) | set(ours)):
        if any(mark in key for mark in TIMING) or key in IGNORED_KEYS:
            continue
        where = f"{path}/{key}"
        lathe_only = key.rsplit("/", 1)[-1] in LATHE_ONLY_FILES
        if key not in ours and not lathe_only:
            found.append(f"{where}: missing on lathe")
        elif key not in theirs and not lathe_only:
            found.append(f"{where}: only on lathe")
        elif key in ours and key in theirs:
            found += differences(ours[key], theirs[key], where, rtol, atol)
    return found


def differences(ours, theirs, path: str = "", rtol: float = 1e-5, atol: float = 1e-6) -> list[str]:
    found = []
    if isinstance(theirs, dict) and isinstance(ours, dict):
        return _dict_differences(ours, theirs, path, rtol, atol)
    elif isinstance(theirs, list) and isinstance(ours, list):
        if len(ours) != len(theirs):
            found.append(f"{path}: {len(ours)} items on lathe, {len(theirs)} on transformers")
        for index, (mine, other) in enumerate(zip(ours, theirs)):
            found += differences(mine, other, f"{path}[{index}]", rtol, atol)
    elif isinstance(theirs, float) or isinstance(ours, float):
        if not (isinstance(ours, (int, float)) and isinstance(theirs, (int, float))):
            found.append(f"{path}: {ours!r} vs {theirs!r}")
        elif not (math.isclose(ours, theirs, rel_tol=rtol, abs_tol=atol) or (math.isnan(ours) and math.isnan(theirs))):
            found.append(f"{path}: {ours!r} on lathe, {theirs!r} on transformers")
    elif isinstance(theirs, str) and isinstance(ours, str) and _untimed(ours) == _untimed(theirs):
        pass
    elif ours != theirs:
        text_a, text_b = repr(ours), repr(theirs)
        found.append(f"{path}: {text_a[:200]} on lathe, {text_b[:200]} on transformers")
    return found


def _untimed(text: str) -> str:
    """A model card without its measured durations ("- **Training**: 4.6 seconds") and temporary folder names."""
    text = re.sub(r"\d+(\.\d+)? (seconds|minutes|hours)", "<duration>", text)
    return re.sub(r"tmp[a-z0-9_]{8}", "<tmp>", text)


def main() -> int:
    with open(sys.argv[1]) as handle:
        theirs = json.load(handle)
    with open(sys.argv[2]) as handle:
        ours = json.load(handle)
    if not ours.get("lathe") or theirs.get("lathe"):
        print("expected the first file from transformers' Trainer and the second from lathe's")
        return 2
    found = differences(
        {k: v for k, v in ours.items() if k != "lathe"}, {k: v for k, v in theirs.items() if k != "lathe"}
    )
    for line in found:
        print(line)
    print(f"{len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
