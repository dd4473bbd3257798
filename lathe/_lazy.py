"""Lazy attribute exports: `import lathe` must not import torch until a name is used."""

from __future__ import annotations

import importlib


def make_getattr(package: str, exports: dict[str, str]):
    """Return a module `__getattr__` that imports `exports[name]` (a submodule path) on first use."""

    def __getattr__(name: str):
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value  # cache: later look-ups skip __getattr__
        return value

    return __getattr__
