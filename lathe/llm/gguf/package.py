"""The one module that imports llama.cpp's `gguf` package (its own GGUF reader and writer, on PyPI),
lazily and with the install hint, so `import lathe` stays fast and lathe runs without it."""

from __future__ import annotations

INSTALL_HINT = "pip install 'lathe[gguf]' (llama.cpp's gguf package, gguf==0.19.0)"


def gguf_package():
    """The `gguf` module, or one ImportError naming what to install."""
    try:
        import gguf
    except ImportError as error:
        raise ImportError(f"export_gguf needs llama.cpp's `gguf` package: {INSTALL_HINT}") from error
    return gguf
