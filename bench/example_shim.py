"""Runs one of transformers' example scripts on transformers' Trainer or, with lathe's names swapped in, on lathe's.

    python bench/example_shim.py {hf,lathe} SCRIPT.py [script arguments...]

Both implementations get the same preparation, so whatever it changes cannot make them differ:
  - bench/example_standins first on sys.path for a local `evaluate` (evaluate.load fetches metric code from the
    hub); the script's own `import torchvision.transforms` gets bench/example_standins/torchvision_transforms.py
    (PyPI's torchvision cannot load beside the CPU torch here; transformers itself still sees no torchvision);
  - what the v4.49 scripts import from transformers.utils and 5.x moved or dropped: `send_example_telemetry`
    (a no-op: no network), `is_offline_mode` (now huggingface_hub's), `check_min_version` (a no-op);
  - `is_torch_tpu_available` (removed in 5; run_fim imports it): answers False; `use_legacy_prediction_loop`
    and `tpu_metrics_debug` (TrainingArguments fields removed in 5; question-answering's trainer helpers read them): False, as a class
    attribute of both argument classes;
  - $EXAMPLE_SOURCE_FIXES (JSON [[old, new], ...], set by bench/example_scripts.py for the scripts whose v4.49 text
    fails on any Trainer, e.g. run_plm's `processing_classtokenizer=`): each `old` is replaced in the script's text
    before it runs, and must occur in it;
  - nltk's "punkt" sentence splitter (a download, run_summarization's post-processing): a stand-in that splits
    after ". ", "! " and "? " (the generated data has no such marks, so each text is one sentence either way).
With `lathe`, bench/hf_trainer_swap.swap_in_lathe() replaces transformers' Trainer-side names (Trainer,
Seq2SeqTrainer, TrainingArguments, HfArgumentParser, the collators, trainer_utils, ...) by lathe's, as for
transformers' own tests (bench/hf_trainer_tests.py), before the script is imported. Writes what it swapped to
$EXAMPLE_SWAPLOG when set.
"""

import json
import os
import re
import runpy
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))


def prepare_transformers():
    import huggingface_hub
    import transformers.utils

    transformers.utils.send_example_telemetry = lambda *args, **kwargs: None
    transformers.utils.check_min_version = lambda *args, **kwargs: None
    transformers.utils.is_offline_mode = huggingface_hub.is_offline_mode
    provide_removed_names()


def provide_removed_names():
    """Names the v4.49 scripts import from transformers' top level that 5.x removed (again after the swap, which
    may leave another top-level module object in sys.modules)."""
    for name in ("TrainingArguments", "Seq2SeqTrainingArguments"):  # read by question-answering's trainer helpers
        arguments = getattr(sys.modules["transformers"], name)
        for removed in ("use_legacy_prediction_loop", "tpu_metrics_debug"):
            if not hasattr(arguments, removed):
                setattr(arguments, removed, False)
    # After the lazy loads above: loading them can put another top-level module object in sys.modules.
    transformers = sys.modules["transformers"]
    if not hasattr(transformers, "is_torch_tpu_available"):
        transformers.is_torch_tpu_available = lambda *args, **kwargs: False


def prepare_nltk():
    try:
        import nltk
    except ImportError:
        return
    find = nltk.data.find

    def find_punkt(resource, *args, **kwargs):
        if resource.startswith("tokenizers/punkt"):
            return resource
        return find(resource, *args, **kwargs)

    nltk.data.find = find_punkt
    nltk.sent_tokenize = lambda text, language="english": [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


def hand_torchvision_to(script):
    """Answers the script's own imports of torchvision (and only those) with the stand-in transforms module."""
    import builtins
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "example_torchvision_transforms", os.path.join(BENCH, "example_standins", "torchvision_transforms.py")
    )
    transforms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(transforms)
    real_import = builtins.__import__

    def script_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name.split(".")[0] == "torchvision" and globals is not None and globals.get("__file__") == script:
            if name != "torchvision.transforms" or not fromlist:
                raise ImportError("example_shim's torchvision stand-in has only `from torchvision.transforms import`")
            return transforms
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = script_import


def apply_source_fixes(text, fixes, script):
    """The script's text with every `old` of [[old, new], ...] replaced; an `old` that does not occur is an error
    (another copy of the script: the fix would silently do nothing)."""
    for old, new in fixes:
        if old not in text:
            raise SystemExit(f"example_shim: source fix {old!r} does not occur in {script}")
        text = text.replace(old, new)
    return text


def main(argv):
    impl, script, script_args = argv[0], os.path.abspath(argv[1]), argv[2:]
    if impl not in ("hf", "lathe"):
        raise SystemExit(f"example_shim: implementation must be hf or lathe, got {impl!r}")
    sys.path.insert(0, os.path.join(BENCH, "example_standins"))
    sys.path.insert(1, BENCH)
    prepare_transformers()
    prepare_nltk()
    if impl == "lathe":
        from hf_trainer_swap import swap_in_lathe

        log = swap_in_lathe()
        provide_removed_names()
        if os.environ.get("EXAMPLE_SWAPLOG"):
            with open(os.environ["EXAMPLE_SWAPLOG"], "w") as handle:
                json.dump(log, handle, indent=1, sort_keys=True)
    hand_torchvision_to(script)
    sys.path.insert(0, os.path.dirname(script))  # the qa scripts import their helpers from their own folder
    sys.argv = [script, *script_args]
    fixes = json.loads(os.environ.get("EXAMPLE_SOURCE_FIXES") or "[]")
    if not fixes:
        runpy.run_path(script, run_name="__main__")
        return
    with open(script, encoding="utf-8") as handle:
        text = apply_source_fixes(handle.read(), fixes, script)
    namespace = {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__}
    exec(compile(text, script, "exec"), namespace)


if __name__ == "__main__":
    main(sys.argv[1:])
