"""GGUF and Ollama export (`export_gguf` in `lathe export`): the exported Hugging Face folder as GGUF files
llama.cpp, Ollama, LM Studio and llama-cpp-python run, each with an Ollama Modelfile. Only
lathe.llm.gguf.package imports llama.cpp's `gguf` package (lazily)."""

from __future__ import annotations

import os

from lathe.llm.gguf.writer import GGUF_TYPES, GGUFFile, parse_gguf_types, write_gguf_files

__all__ = ["GGUF_TYPES", "GGUFFile", "export_gguf", "parse_gguf_types", "run_commands"]


def export_gguf(export_dir: str, types: list[str], template, tokenizer) -> list[tuple[GGUFFile, str]]:
    """Each type as a GGUF file in export_dir, with its Modelfile (`Modelfile` for the first type,
    `Modelfile.<type>` for the others); returns (file, Modelfile path) pairs."""
    from lathe.llm.gguf.modelfile import modelfile

    written = []
    for index, gguf_file in enumerate(write_gguf_files(export_dir, types)):
        name = "Modelfile" if index == 0 else f"Modelfile.{gguf_file.type}"
        path = os.path.join(export_dir, name)
        adds_bos = bool(gguf_file.tokenizer.get("add_bos"))
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(modelfile(os.path.basename(gguf_file.path), template, tokenizer, adds_bos))
        written.append((gguf_file, path))
    return written


def run_commands(gguf_file: GGUFFile, modelfile_path: str) -> list[str]:
    """How to run a written file: llama.cpp's CLI and Ollama."""
    name = os.path.basename(gguf_file.path).removesuffix(".gguf").lower()
    return [f"llama-cli -m {gguf_file.path} -cnv", f"ollama create {name} -f {modelfile_path}"]
