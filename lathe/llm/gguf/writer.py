"""GGUF files from an exported Hugging Face folder (`export_gguf` of `lathe export`), one per type, written
with llama.cpp's own `gguf.GGUFWriter` beside the folder's safetensors.

Types: f32, f16, bf16 and q8_0 are made here by `gguf`'s Python quantizers (the same code llama.cpp's
converter uses; as there, norms, biases and other 1-D tensors stay f32, and a matrix whose rows do not
split into 32-value blocks falls back to f16). The k-quants q4_k_m, q5_k_m and q6_k need llama.cpp's
quantizer (its per-tensor mixes are llama.cpp's, and `gguf` has no Python k-quantizer): lathe calls it
through llama-cpp-python (`pip install llama-cpp-python`) or a `llama-quantize` program on PATH, on an
intermediate f16/bf16 file it deletes afterwards; with neither, the error says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from lathe.llm.gguf.architectures import (
    UnsupportedModel,
    converted_tensors,
    llama_cpp_architecture,
    write_hyperparameters,
)
from lathe.llm.gguf.package import gguf_package
from lathe.llm.gguf.vocab import write_tokenizer

DIRECT_TYPES = ("f32", "f16", "bf16", "q8_0")
K_QUANTS = ("q4_k_m", "q5_k_m", "q6_k")
GGUF_TYPES = DIRECT_TYPES + K_QUANTS
K_QUANT_HINT = "pip install llama-cpp-python (compiles llama.cpp), or put llama.cpp's llama-quantize on PATH"


@dataclass
class GGUFFile:
    path: str
    type: str
    bytes: int
    tensors: int
    tokenizer: dict = field(default_factory=dict)


def parse_gguf_types(value) -> list[str]:
    """export_gguf: one type or a list (YAML list or "f16,q8_0"); [] when unset."""
    if value is None or value == "" or value == []:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    types = []
    for item in items:
        name = str(item).strip().lower()
        if name not in GGUF_TYPES:
            raise ValueError(f"export_gguf: unknown GGUF type {item!r}; choose from {', '.join(GGUF_TYPES)}.")
        if name not in types:
            types.append(name)
    return types


def check_gguf_types(types: list[str], model_dir: str | None = None) -> None:
    """Before any work: the gguf package is there, llama.cpp's quantizer when a k-quant is asked for, and
    the model's architecture is one written as GGUF (when its config.json is a local file)."""
    if types:
        gguf_package()
    if any(kind in K_QUANTS for kind in types):
        _k_quantizer()
    path = os.path.join(model_dir or "", "config.json")
    if types and model_dir and os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            llama_cpp_architecture(json.load(handle))


def write_gguf_files(folder: str, types: list[str], name: str | None = None) -> list[GGUFFile]:
    """Each requested type as `<name>-<type>.gguf` in `folder` (an exported Hugging Face model folder)."""
    gguf_package()  # the install hint before any work
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    arch = llama_cpp_architecture(config)
    name = name or os.path.basename(os.path.normpath(folder)) or "model"
    quantizer = _k_quantizer() if any(kind in K_QUANTS for kind in types) else None
    written = []
    intermediate = temporary = None
    for kind in types:
        path = os.path.join(folder, f"{name}-{kind}.gguf")
        if kind in DIRECT_TYPES:
            written.append(_write_one(folder, config, arch, kind, path, name))
            continue
        if intermediate is None:
            source = next((f for f in written if f.type in ("f16", "bf16", "f32")), None)
            if source is None:
                base = "bf16" if config.get("dtype", config.get("torch_dtype")) == "bfloat16" else "f16"
                temporary = os.path.join(folder, f".{name}-{base}.tmp.gguf")
                source = _write_one(folder, config, arch, base, temporary, name)
            intermediate = source
        quantizer(intermediate.path, path, kind)
        written.append(GGUFFile(path, kind, os.path.getsize(path), intermediate.tensors, intermediate.tokenizer))
    if temporary is not None:
        os.remove(temporary)
    return written


def _write_one(folder: str, config: dict, arch: str, kind: str, path: str, name: str) -> GGUFFile:
    gguf = gguf_package()
    vocab_size = config["vocab_size"]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(name)
    write_hyperparameters(writer, config, arch, vocab_size)
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[kind]
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    chat_template = _chat_template(folder)
    tokenizer = write_tokenizer(writer, folder, vocab_size, chat_template)
    count = 0
    for new_name, data in converted_tensors(config, arch, _read_tensors(folder), vocab_size):
        data, qtype = _encoded(data, new_name, kind, gguf)
        writer.add_tensor(new_name, data, raw_dtype=qtype)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFFile(path, kind, os.path.getsize(path), count, tokenizer)


def _encoded(data, name: str, kind: str, gguf):
    """A float32 array in the file's type, as llama.cpp's converter chooses it per tensor."""
    types = gguf.GGMLQuantizationType
    if data.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") or kind == "f32":
        return data.astype("float32"), types.F32
    qtype = {"f16": types.F16, "bf16": types.BF16, "q8_0": types.Q8_0}[kind]
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:  # rows that do not split into 32-value blocks
        return gguf.quants.quantize(data, types.F16), types.F16


def _read_tensors(folder: str):
    """(name, float32 numpy array) of every safetensors file in the folder."""
    from safetensors import safe_open

    files = sorted(name for name in os.listdir(folder) if name.endswith(".safetensors"))
    if not files:
        raise UnsupportedModel(f"export_gguf: {folder} holds no .safetensors weights.")
    for file in files:
        with safe_open(os.path.join(folder, file), framework="pt") as handle:
            for key in handle.keys():
                yield key, handle.get_tensor(key).float().numpy()


def _chat_template(folder: str) -> str | None:
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            template = json.load(handle).get("chat_template")
        return template if isinstance(template, str) else None
    return None


def _k_quantizer():
    """llama.cpp's quantizer: llama-cpp-python's binding, else the llama-quantize program."""
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    if llama_cpp is not None:
        return lambda source, target, kind: _quantize_with_binding(llama_cpp, source, target, kind)
    program = shutil.which("llama-quantize")
    if program is not None:
        return lambda source, target, kind: _quantize_with_program(program, source, target, kind)
    raise ImportError(f"export_gguf: the k-quants ({', '.join(K_QUANTS)}) need llama.cpp's quantizer: {K_QUANT_HINT}.")


def _quantize_with_binding(llama_cpp, source: str, target: str, kind: str) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind.upper()}")
    params.nthread = os.cpu_count() or 1
    import ctypes

    status = llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))
    if status != 0 or not os.path.isfile(target):
        raise RuntimeError(f"export_gguf: llama.cpp's quantizer failed ({status}) making {target}.")


def _quantize_with_program(program: str, source: str, target: str, kind: str) -> None:
    result = subprocess.run([program, source, target, kind.upper()], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"export_gguf: {program} failed making {target}: {result.stderr.strip()[-500:]}")
