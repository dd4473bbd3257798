"""pytest plugin for bench/hf_trainer_tests.py: records every test's outcome, and (HF_TESTS_SWAP=1) puts lathe's
Trainer-side names in place of transformers' before the transformers test files are imported.

Loaded with `-p hf_trainer_swap` (bench/ on PYTHONPATH). Environment:
  HF_TESTS_RESULTS  path of the JSON-lines file each test report is appended to (required)
  HF_TESTS_SWAP     "1": replace transformers' Trainer-side names by lathe's (lathe must be importable)
  HF_TESTS_SWAPLOG  path where the swap writes what it replaced, kept or stubbed (JSON)
"""

import ast
import importlib
import inspect
import json
import os
import sys


def _swapped_modules() -> dict:
    """transformers module -> lathe module with the same public names: lathe.patch_transformers()'s table."""
    from lathe.train.features.patching import SWAPPED_MODULES

    return SWAPPED_MODULES


# Modules of which lathe provides a part: the functions lathe has replace transformers' (so the tests' library
# logger, `logging.get_logger()`, and `set_verbosity` are lathe's, as after a user's import change); the rest
# stays transformers' own (its tqdm, warning_once, ... keep working for transformers' code).
PARTLY_SWAPPED_MODULES = {
    "transformers.utils.logging": "lathe.utils.logging",
}

# Names 5.23 removed but test files of that era still import at module level (an import error would hide every
# test of the file). They become stubs in both runs; the tests that use them fail on transformers and are excluded.
REMOVED_IN_523 = {
    "transformers": ["GlueDataset", "GlueDataTrainingArguments", "DataCollatorForWholeWordMask"],
}


class MissingInLathe(NotImplementedError):
    """Raised when a test uses a transformers name that lathe does not provide."""


def _stub_class(name, owner, why):
    """A class standing for a missing name: isinstance() works, construction or attribute use raises."""

    def fail(*_args, **_kwargs):
        raise MissingInLathe(f"{owner}.{name}: {why}")

    class Meta(type):
        __call__ = fail

        def __getattr__(cls, attribute):
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            fail()

    return Meta(name, (), {"__module__": owner, "__doc__": why})


def _stub_function(name, owner, why):
    def missing(*_args, **_kwargs):
        raise MissingInLathe(f"{owner}.{name}: {why}")

    missing.__name__ = missing.__qualname__ = name
    return missing


def defined_public_names(module):
    """Public names a module defines itself (def, class, assignment at top level), not the ones it imports."""
    tree = ast.parse(inspect.getsource(module))
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.extend(t.id for t in targets if isinstance(t, ast.Name))
    return [n for n in dict.fromkeys(names) if not n.startswith("_")]


def final_transformers():
    """transformers' top-level module object as tests will see it (the import replaces it part-way)."""
    import transformers  # noqa: F401
    import transformers.processing_utils  # noqa: F401  (the import that installs the final module object)

    return sys.modules["transformers"]


def _set_everywhere(top, module, name, original, replacement):
    setattr(module, name, replacement)
    if getattr(top, name, None) is original:
        setattr(top, name, replacement)
    data = sys.modules.get("transformers.data")
    if data is not None and getattr(data, name, None) is original:
        setattr(data, name, replacement)


def swap_in_lathe():
    """Replace the names each swapped module (lathe.patch_transformers()'s table) defines by lathe's; stub the callables lathe lacks."""
    top = final_transformers()
    log = {"replaced": {}, "stubbed": {}, "kept_constants": {}}
    for module_name, lathe_name in _swapped_modules().items():
        module = importlib.import_module(module_name)
        lathe_module = importlib.import_module(lathe_name)
        for name in defined_public_names(module):
            original = getattr(module, name)
            if hasattr(lathe_module, name):
                replacement = getattr(lathe_module, name)
                log["replaced"].setdefault(module_name, []).append(name)
            elif inspect.isclass(original):
                replacement = _stub_class(name, module_name, f"lathe has no {name} (expected in {lathe_name})")
                log["stubbed"].setdefault(module_name, []).append(name)
            elif callable(original):
                replacement = _stub_function(name, module_name, f"lathe has no {name} (expected in {lathe_name})")
                log["stubbed"].setdefault(module_name, []).append(name)
            else:
                # Constants (file names, default lists): data, not behaviour; transformers' value stays.
                log["kept_constants"].setdefault(module_name, []).append(name)
                continue
            _set_everywhere(top, module, name, original, replacement)
    for module_name, lathe_name in PARTLY_SWAPPED_MODULES.items():
        module, lathe_module = importlib.import_module(module_name), importlib.import_module(lathe_name)
        for name in defined_public_names(module):
            if callable(getattr(module, name)) and callable(getattr(lathe_module, name, None)):
                setattr(module, name, getattr(lathe_module, name))
                log["replaced"].setdefault(module_name, []).append(name)
    return log


def add_removed_names():
    top = final_transformers()
    for owner, names in REMOVED_IN_523.items():
        for name in names:
            if not hasattr(top, name):
                setattr(top, name, _stub_class(name, owner, "removed in transformers 5.23"))


def pytest_configure(config):
    add_removed_names()
    if os.environ.get("HF_TESTS_SWAP") == "1":
        log = swap_in_lathe()
        if os.environ.get("HF_TESTS_SWAPLOG"):
            with open(os.environ["HF_TESTS_SWAPLOG"], "w") as handle:
                json.dump(log, handle, indent=1, sort_keys=True)


def _first_line(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    if isinstance(report.longrepr, tuple):  # skips: (file, line, reason)
        text = report.longrepr[2]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def pytest_runtest_logreport(report):
    """One line per phase that decides the outcome: a failed/skipped setup, or the call."""
    if report.when != "call" and report.outcome == "passed":
        return
    record = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "duration": round(report.duration, 3),
    }
    if report.outcome != "passed":
        record["message"] = _first_line(report)
    with open(os.environ["HF_TESTS_RESULTS"], "a") as handle:
        handle.write(json.dumps(record) + "\n")


def pytest_collectreport(report):
    """A test file that fails to import is recorded as one error for the file."""
    if report.outcome == "failed":
        record = {"nodeid": report.nodeid, "when": "collect", "outcome": "error", "message": _first_line(report)}
        with open(os.environ["HF_TESTS_RESULTS"], "a") as handle:
            handle.write(json.dumps(record) + "\n")
