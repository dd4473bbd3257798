"""`lathe.patch_transformers()`: put lathe's Trainer-side classes and functions in place of transformers' own,
so that a library whose trainer subclasses `transformers.Trainer` (sentence-transformers, TRL, setfit) or a
script importing from `transformers` trains on lathe. Call it before that library is imported: a library
binds `from transformers import Trainer` once, at its own import.

`import transformers` replaces its top-level module object part-way (when `processing_utils` loads), so the
final object is patched, and so are the submodules the names are defined in (`transformers.trainer`,
`.training_args`, `.trainer_callback`, ...): `from transformers.trainer import Trainer` gets lathe's too.
Only names lathe provides are replaced; transformers' other names (models, tokenizers, generation) stay.
"""

from __future__ import annotations

import importlib
import sys

# transformers module -> lathe module with the same public names (lathe's compatibility import paths).
SWAPPED_MODULES = {
    "transformers.trainer": "lathe.trainer",
    "transformers.training_args": "lathe.training_args",
    "transformers.trainer_callback": "lathe.trainer_callback",
    "transformers.trainer_utils": "lathe.trainer_utils",
    "transformers.hf_argparser": "lathe.hf_argparser",
    "transformers.optimization": "lathe.optimization",
    "transformers.data.data_collator": "lathe.data_collator",
    "transformers.trainer_seq2seq": "lathe.trainer_seq2seq",
    "transformers.training_args_seq2seq": "lathe.training_args_seq2seq",
    "transformers.trainer_jit_checkpoint": "lathe.trainer_jit_checkpoint",
}

# Libraries known to subclass the Trainer: patching after they were imported leaves them on transformers'.
LIBRARIES = ("sentence_transformers", "trl", "setfit")

# Submodules that bind names from those above at their own import (so later `from ... import` sees them).
_ALSO_BOUND_IN = ("transformers.data", "transformers.integrations", "transformers.trainer_pt_utils")


def patch_transformers() -> dict[str, list[str]]:
    """Replace transformers' Trainer, TrainingArguments, Seq2SeqTrainer, callbacks, collators, schedules,
    trainer utilities by lathe's, everywhere transformers exposes them; return {module: names replaced}.
    Idempotent. Raises if a library built on the Trainer was imported first (it holds transformers' classes)."""
    imported = [name for name in LIBRARIES if name in sys.modules]
    if imported and not getattr(sys.modules.get("transformers"), "_lathe_patched", False):
        raise RuntimeError(
            f"lathe.patch_transformers() must run before importing {', '.join(imported)}: it already bound "
            "transformers' Trainer classes. Call it first (before the library's import)."
        )
    top = final_transformers()
    replaced: dict[str, list[str]] = {}
    for module_name, lathe_name in SWAPPED_MODULES.items():
        module = importlib.import_module(module_name)
        lathe_module = importlib.import_module(lathe_name)
        for name, original in list(vars(module).items()):
            # classes and functions: transformers' constants (file names, defaults) and loggers stay its own
            if name.startswith("_") or not callable(original) or not hasattr(lathe_module, name):
                continue
            replacement = getattr(lathe_module, name)
            if replacement is original:
                continue
            _set_everywhere(top, module, name, original, replacement)
            replaced.setdefault(module_name, []).append(name)
    top._lathe_patched = True
    return replaced


def final_transformers():
    """transformers' top-level module object as later imports see it (the import replaces it part-way)."""
    import transformers  # noqa: F401
    import transformers.processing_utils  # noqa: F401  (the import that installs the final module object)

    return sys.modules["transformers"]


def _set_everywhere(top, module, name, original, replacement) -> None:
    setattr(module, name, replacement)
    if getattr(top, name, None) is original:
        setattr(top, name, replacement)
    for other_name in _ALSO_BOUND_IN:
        other = sys.modules.get(other_name)
        if other is not None and getattr(other, name, None) is original:
            setattr(other, name, replacement)
