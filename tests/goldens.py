"""Comparing a fresh run with numbers recorded in a file (a golden) on another machine: one tolerance for all.

A golden (tests/llm/golden/*, a JSON or safetensors file) was written on the developers' CPU. The same
operations on another CPU round differently in the last bits: PyTorch picks its vectorised kernels by the CPU
(`ATEN_CPU_CAPABILITY`: default / avx2 / avx512), MKL picks its own code path by the CPU, and a thread count
splits a reduction differently. docs/GOLDENS.md records what was measured (float32 step losses, grad norms and
weight checksums moved by up to 7.4e-7 relative, a few ulp) and why the tolerance below is what it is; tests widen
it only where a measurement or an analysis says so (Muon's bfloat16 updates, log-prob sums, audio features).

- `assert_close_to_golden(actual, golden, what)`: floats within `GOLDEN_REL * |golden| + GOLDEN_ABS`; integers
  (token ids, counts, steps), strings, booleans and None exactly; lists, tuples, dicts, numpy arrays and torch
  tensors element by element (same length / keys / shape / dtype kind).
- `json_without_versions(path)` / `assert_same_files(written, committed, what)`: files that embed a library
  version (`config.json`'s `transformers_version`, ...) are compared parsed, minus those fields, never byte
  for byte.

Where both sides run in the same test on the same machine (lathe against transformers in one process, a resumed
run against an uninterrupted one), tests keep their bit-for-bit assertions: that is not a golden.

`LATHE_GOLDEN_REPORT=/path/file.jsonl` appends, for every comparison, the largest absolute and relative
difference and the largest share of the tolerance used (1.0: at the limit): how bench/golden_drift.py measured
docs/GOLDENS.md's numbers.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

# float32 has a 24-bit mantissa: 1 ulp is 6e-8 to 1.2e-7 relative. Step losses, grad norms and weight checksums
# moved by at most 7.4e-7 relative under other CPU kernels (docs/GOLDENS.md), using at most 0.07 of this
# tolerance; 2e-6 is ~20 ulp. A changed computation (one step more, another learning rate, a lost token) moves a
# loss by 1e-3 or more, so it still fails.
GOLDEN_REL = 2e-6
# Numbers near zero (a reward margin, a kl of 1e-9, a mel feature of 0) carry the absolute rounding of the larger
# numbers they are differences of: 1e-6 absolute.
GOLDEN_ABS = 1e-6
# Keys that name a library's version: dropped before comparing a written file with a committed one.
VERSION_SUFFIX = "_version"


def _leaves(actual, golden, path):
    """Yield (path, actual, golden) for every leaf, raising on a structural difference."""
    if isinstance(golden, dict):
        assert isinstance(actual, dict), f"{path}: expected a dict, got {type(actual).__name__}"
        assert sorted(actual) == sorted(golden), f"{path}: keys {sorted(actual)} != golden {sorted(golden)}"
        for key in golden:
            yield from _leaves(actual[key], golden[key], f"{path}[{key!r}]")
        return
    if hasattr(golden, "tolist") and not isinstance(golden, (int, float)):  # numpy array, torch tensor
        assert tuple(actual.shape) == tuple(golden.shape), f"{path}: shape {tuple(actual.shape)} != {golden.shape}"
        floating = _is_float_array(golden)
        assert floating == _is_float_array(actual), f"{path}: dtype {actual.dtype} vs golden {golden.dtype}"
        if floating:  # compared whole (tests/goldens.py's loop would take seconds on a spectrogram)
            yield path, _as_float64(actual), _as_float64(golden)
            return
        actual, golden = actual.tolist(), golden.tolist()
    if isinstance(golden, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"{path}: expected a sequence, got {type(actual).__name__}"
        assert len(actual) == len(golden), f"{path}: {len(actual)} items, golden {len(golden)}"
        for index, (mine, theirs) in enumerate(zip(actual, golden)):
            yield from _leaves(mine, theirs, f"{path}[{index}]")
        return
    yield path, actual, golden


def _as_float64(value):
    import numpy as np

    if hasattr(value, "detach"):  # torch (bfloat16 has no numpy dtype)
        value = value.detach().cpu().double().numpy()
    return np.asarray(value, dtype=np.float64)


def _array_differences(path, mine, theirs, rel, abs):
    """(largest absolute and relative difference, largest share of the tolerance, failure lines) of two arrays."""
    import numpy as np

    difference = np.abs(mine - theirs)
    same_nan = np.isnan(mine) & np.isnan(theirs)
    difference[same_nan] = 0.0
    bad = ~(difference <= abs + rel * np.abs(theirs)) & ~same_nan  # NaN on one side only is bad
    nonzero = theirs != 0
    worst_rel = float((difference[nonzero] / np.abs(theirs[nonzero])).max()) if nonzero.any() else 0.0
    worst_abs = float(difference.max()) if difference.size else 0.0
    used = float((difference / (abs + rel * np.abs(theirs))).max()) if difference.size else 0.0
    failures = [
        f"{path}{[int(i) for i in index]}: {float(mine[index])!r}, golden {float(theirs[index])!r}"
        for index in zip(*np.nonzero(bad))
    ][:10]
    if bad.sum() > len(failures):
        failures.append(f"{path}: {int(bad.sum())} elements differ in all")
    return worst_abs, worst_rel, used, failures


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_float_array(value) -> bool:
    dtype = value.dtype
    if hasattr(dtype, "is_floating_point"):  # torch
        return dtype.is_floating_point or dtype.is_complex
    return dtype.kind in ("f", "c")  # numpy


def assert_close_to_golden(actual, golden, what: str, rel: float = GOLDEN_REL, abs: float = GOLDEN_ABS) -> None:
    """Assert a fresh result equals a recorded one: floats to `rel`/`abs` (module docstring), the rest exactly.
    `what` names the golden in the failure message (file, case, key)."""
    worst_abs = worst_rel = worst_used = 0.0
    failures = []
    for path, mine, theirs in _leaves(actual, golden, what):
        if hasattr(theirs, "dtype"):  # a float array
            array_abs, array_rel, array_used, array_failures = _array_differences(path, mine, theirs, rel, abs)
            worst_abs, worst_rel = max(worst_abs, array_abs), max(worst_rel, array_rel)
            worst_used = max(worst_used, array_used)
            failures += array_failures
        elif _is_number(mine) and _is_number(theirs) and (isinstance(mine, float) or isinstance(theirs, float)):
            if math.isnan(theirs) or math.isnan(mine):
                if not (math.isnan(theirs) and math.isnan(mine)):
                    failures.append(f"{path}: {mine!r}, golden {theirs!r}")
                continue
            difference = math.fabs(mine - theirs)
            worst_abs = max(worst_abs, difference)
            worst_used = max(worst_used, difference / (abs + rel * math.fabs(theirs)) if abs or rel else 0.0)
            if theirs != 0:
                worst_rel = max(worst_rel, difference / math.fabs(theirs))
            if difference > abs + rel * math.fabs(theirs):
                failures.append(f"{path}: {mine!r}, golden {theirs!r} (difference {difference:.3g})")
        elif mine != theirs or isinstance(mine, bool) != isinstance(theirs, bool):
            failures.append(f"{path}: {mine!r}, golden {theirs!r} (compared exactly)")
    _report(what, worst_abs, worst_rel, worst_used)
    assert not failures, (
        f"{len(failures)} value(s) differ from the golden beyond rel {rel:g} / abs {abs:g} (docs/GOLDENS.md):\n  "
        + "\n  ".join(failures[:10])
    )


def _report(what: str, worst_abs: float, worst_rel: float, worst_used: float) -> None:
    target = os.environ.get("LATHE_GOLDEN_REPORT")
    if target:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"what": what, "abs": worst_abs, "rel": worst_rel, "used": worst_used}) + "\n")


def _drop_versions(value):
    if isinstance(value, dict):
        return {key: _drop_versions(item) for key, item in value.items() if not key.endswith(VERSION_SUFFIX)}
    if isinstance(value, list):
        return [_drop_versions(item) for item in value]
    return value


def json_without_versions(path) -> object:
    """A JSON file's content without the `*_version` keys a library writes (transformers_version, ...)."""
    return _drop_versions(json.loads(Path(path).read_text(encoding="utf-8")))


def assert_same_files(written, committed, what: str) -> None:
    """Two folders hold the same files: JSON ones equal once parsed, minus `*_version` keys; others byte for byte."""
    written, committed = Path(written), Path(committed)
    names = {p.relative_to(written) for p in written.rglob("*") if p.is_file()}
    assert names == {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()}, what
    for name in sorted(names):
        if name.suffix == ".json":
            same = json_without_versions(written / name) == json_without_versions(committed / name)
        else:
            same = (written / name).read_bytes() == (committed / name).read_bytes()
        assert same, f"{what}: {name} differs"


def load_generator(path, name: str):
    """A golden's generator script (tests/llm/golden/make_*.py) imported as module `name`: tests reuse its cases."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def safetensors_golden(path) -> tuple[dict, dict]:
    """({name: tensor}, metadata) of a safetensors golden."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}, f.metadata()
