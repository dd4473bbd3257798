"""Compares two output folders of the same example script (transformers' Trainer vs lathe's): the comparison
functions of bench/example_scripts.py, kept apart so the suite can test them without running anything.

Columns of the comparison (each: equal or the first difference found):
  log_history  trainer_state.json's log_history, entry by entry, key by key
  results      the *_results.json files the scripts write (all_/train_/eval_/predict_results.json)
  predictions  what the scripts write from predict/generate: predict_results*.txt, generated_predictions.txt, ...
  files        the folder layout (lathe's documented extra files allowed) and every other file's content
  weights      every *.safetensors tensor (top level and in each checkpoint-N)
Floats are equal within a relative tolerance (1e-5 by default); timings (*_runtime, *_per_second) are skipped.
"""

import json
import math
import os
import re

RTOL = 1e-5
ABS_TOL = 1e-9
TIMING_KEY = re.compile(r"(_runtime|_per_second)$")
# Files lathe writes beside transformers' ones, documented in README.md ("Checkpoints"): the completion manifest
# rotation and resume trust, and the training arguments as JSON (read back on resume without unpickling).
ALLOWED_EXTRA = {"lathe_checkpoint.json", "training_args.json"}
# The one line by which lathe's model card differs from transformers' (docs/COMPATIBILITY.md): "- lathe <version>"
# at the end of "Framework versions".
LATHE_CARD_LINE = re.compile(r"^- lathe \S+\n?$")
# Pickled TrainingArguments: the class (transformers' or lathe's) differs by design; only its presence counts.
NOT_COMPARED = {"training_args.bin"}
PREDICTION_FILE = re.compile(r"^(predict_results.*\.txt|generated_predictions\.txt|.*predictions.*\.(txt|json))$")
RESULTS_FILE = re.compile(r"^(all|train|eval|predict|test)_results\.json$")
COLUMNS = ("log_history", "results", "predictions", "files", "weights")


def short(value, width=60):
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def diff_values(a, b, path="", rtol=RTOL):
    """The first difference between two JSON-like values as (path, a, b), or None. Floats within rtol are equal;
    keys that are timings are skipped."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys_a = {k for k in a if not TIMING_KEY.search(str(k))}
        keys_b = {k for k in b if not TIMING_KEY.search(str(k))}
        for key in sorted(keys_a ^ keys_b, key=str):
            return (f"{path}.{key}" if path else str(key), a.get(key, "<absent>"), b.get(key, "<absent>"))
        for key in sorted(keys_a, key=str):
            found = diff_values(a[key], b[key], f"{path}.{key}" if path else str(key), rtol)
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return (f"{path} (length)", len(a), len(b))
        for index, (x, y) in enumerate(zip(a, b)):
            found = diff_values(x, y, f"{path}[{index}]", rtol)
            if found:
                return found
        return None
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None if a == b else (path, a, b)
    if math.isnan(a) and math.isnan(b):
        return None
    return None if math.isclose(a, b, rel_tol=rtol, abs_tol=ABS_TOL) else (path, a, b)


def diff_log_history(a, b, rtol=RTOL):
    """The first difference between two log_history lists: a dict with the entry's step, the key and both
    values, or None. Entries are compared in order (a missing or extra entry is a difference at its step)."""
    for index in range(max(len(a), len(b))):
        if index >= len(a) or index >= len(b):
            entry = (b if index >= len(a) else a)[index]
            side = "lathe" if index >= len(a) else "transformers"
            return {"step": entry.get("step"), "key": f"entry {index} only in {side}", "hf": None, "lathe": None}
        found = diff_values(a[index], b[index], "", rtol)
        if found:
            return {"step": a[index].get("step"), "key": found[0], "hf": found[1], "lathe": found[2]}
    return None


def describe_log(first):
    if first is None:
        return None
    if first["hf"] is None and first["lathe"] is None:
        return f"step {first['step']}: {first['key']}"
    return f"step {first['step']} {first['key']}: {short(first['hf'], 24)} vs {short(first['lathe'], 24)}"


def list_files(root):
    """Every file under root, as paths relative to it with '/' separators, sorted."""
    found = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    return sorted(found)


def diff_layout(files_a, files_b, allowed_extra=ALLOWED_EXTRA):
    """(missing on the lathe side, extra on the lathe side that are not allowed): both sorted lists."""
    a, b = set(files_a), set(files_b)
    missing = sorted(a - b)
    extra = sorted(p for p in b - a if p.rsplit("/", 1)[-1] not in allowed_extra)
    return missing, extra


def diff_arrays(a, b, rtol=RTOL):
    """None when two arrays (numpy or torch) have the same shape, dtype kind and values within rtol; else why."""
    import numpy as np

    a = a.detach().cpu().float().numpy() if hasattr(a, "detach") and a.is_floating_point() else np.asarray(a)
    b = b.detach().cpu().float().numpy() if hasattr(b, "detach") and b.is_floating_point() else np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        bad = ~np.isclose(a64, b64, rtol=rtol, atol=ABS_TOL, equal_nan=True)
        if bad.any():
            scale = np.maximum(np.abs(a64), np.abs(b64))[bad]
            rel = float(np.max(np.abs(a64 - b64)[bad] / np.where(scale > 0, scale, 1)))
            return f"{int(bad.sum())}/{a.size} values differ, max rel {rel:.2g}"
        return None
    return None if np.array_equal(a, b) else f"{int((a != b).sum())}/{a.size} values differ"


def diff_nested(a, b, path="", rtol=RTOL):
    """The first difference between two loaded checkpoint objects (dicts, lists, tensors, arrays, scalars)."""
    if hasattr(a, "shape") and hasattr(b, "shape"):
        why = diff_arrays(a, b, rtol)
        return (path, why) if why else None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return (path, f"keys {sorted(map(str, set(a) ^ set(b)))[:4]}")
        for key in a:
            found = diff_nested(a[key], b[key], f"{path}.{key}" if path else str(key), rtol)
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return (path, f"length {len(a)} vs {len(b)}")
        for index, (x, y) in enumerate(zip(a, b)):
            found = diff_nested(x, y, f"{path}[{index}]", rtol)
            if found:
                return found
        return None
    found = diff_values(a, b, path, rtol)
    return (found[0], f"{short(found[1], 20)} vs {short(found[2], 20)}") if found else None


def load_file(path):
    """A file's content in the form it is compared in: parsed JSON, a dict of tensors, a loaded torch object, text."""
    name = os.path.basename(path)
    if name.endswith(".json"):
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    if name.endswith(".safetensors"):
        from safetensors.torch import load_file as load_safetensors

        return load_safetensors(path)
    if name.endswith((".pt", ".pth", ".bin")):
        import torch

        return torch.load(path, map_location="cpu", weights_only=False)
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def column_of(relpath):
    name = relpath.rsplit("/", 1)[-1]
    top = "/" not in relpath
    if name.endswith(".safetensors"):
        return "weights"
    if top and RESULTS_FILE.match(name):
        return "results"
    if PREDICTION_FILE.match(name):
        return "predictions"
    return "files"


def _first_text_difference(a, b):
    lines_a, lines_b = a.splitlines(), b.splitlines()
    for number, (x, y) in enumerate(zip(lines_a, lines_b), 1):
        if x != y:
            return f"line {number}: {short(x, 30)} vs {short(y, 30)}"
    return f"{len(lines_a)} vs {len(lines_b)} lines"


def compare_file(path_a, path_b, relpath, rtol=RTOL):
    """None when equal, else a short description of the first difference."""
    a, b = load_file(path_a), load_file(path_b)
    if relpath.endswith("trainer_state.json"):
        # The top level's log_history is its own column; a checkpoint's is a prefix of it.
        a, b = dict(a), dict(b)
        first = diff_log_history(a.pop("log_history", []), b.pop("log_history", []), rtol)
        if first and "/" in relpath:
            return "log_history " + describe_log(first)
    if isinstance(a, str) and isinstance(b, str):
        if relpath.rsplit("/", 1)[-1] == "README.md":  # the model card: lathe adds its framework-version line
            # (stripped on both sides: --determinism compares lathe's folder with lathe's)
            a, b = ("".join(x for x in t.splitlines(keepends=True) if not LATHE_CARD_LINE.match(x)) for t in (a, b))
        return None if a == b else _first_text_difference(a, b)
    if relpath.endswith(".json"):
        found = diff_values(a, b, "", rtol)
        return None if found is None else f"{found[0]}: {short(found[1], 20)} vs {short(found[2], 20)}"
    found = diff_nested(a, b, "", rtol)
    return None if found is None else f"{found[0] or '(value)'}: {found[1]}"


def compare_runs(dir_a, dir_b, rtol=RTOL):
    """{column: None (equal) or the first difference (text)} for two output folders; dir_a is transformers'.
    "not_written" lists the columns for which neither folder has a file (e.g. no predictions); "differing_files"
    maps every file present on both sides that differs to its first difference."""
    report = {column: None for column in COLUMNS}
    files_a, files_b = list_files(dir_a), list_files(dir_b)
    missing, extra = diff_layout(files_a, files_b)
    if missing or extra:
        report["files"] = "layout: " + "; ".join(
            [f"missing {short(missing, 70)}" if missing else "", f"extra {short(extra, 70)}" if extra else ""]
        ).strip("; ")
    state_a, state_b = os.path.join(dir_a, "trainer_state.json"), os.path.join(dir_b, "trainer_state.json")
    if os.path.isfile(state_a) and os.path.isfile(state_b):
        first = diff_log_history(load_file(state_a)["log_history"], load_file(state_b)["log_history"], rtol)
        report["log_history"] = describe_log(first)
    elif os.path.isfile(state_a) != os.path.isfile(state_b):
        report["log_history"] = "trainer_state.json on one side only"
    # Checkpoints before the top level, in step order, so the first difference named is the earliest one.
    order = sorted(set(files_a) & set(files_b), key=lambda p: (p.count("/") == 0, _step_of(p), p))
    written = {column_of(p) for p in set(files_a) | set(files_b)} | {"files"}
    if "trainer_state.json" in set(files_a) | set(files_b):
        written.add("log_history")
    report["not_written"] = [column for column in COLUMNS if column not in written]
    report["differing_files"] = {}
    for relpath in order:
        column = column_of(relpath)
        if relpath.rsplit("/", 1)[-1] in NOT_COMPARED | ALLOWED_EXTRA:  # lathe's extras: one side only vs transformers
            continue
        why = compare_file(os.path.join(dir_a, relpath), os.path.join(dir_b, relpath), relpath, rtol)
        if why:
            report["differing_files"][relpath] = why
            if report[column] is None:
                report[column] = f"{relpath}: {why}"
    return report


def _step_of(relpath):
    match = re.match(r"checkpoint-(\d+)/", relpath)
    return int(match.group(1)) if match else 0
