"""Run by bench/gguf_llamacpp.py inside the venv that has llama-cpp-python (llama.cpp compiled at install;
its low-level C API through ctypes): tokenizes texts, evaluates logits and greedy continuations of GGUF
files, and quantizes (the `llama-quantize` stand-in lathe finds on PATH). Reads a JSON job on stdin,
writes JSON.

    python gguf_llamacpp_runner.py quantize SOURCE TARGET TYPE
    python gguf_llamacpp_runner.py < job.json > result.json
"""

from __future__ import annotations

import ctypes
import json
import sys

import llama_cpp as lib
import numpy as np

lib.llama_backend_init()


def quantize(source: str, target: str, kind: str) -> int:
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{kind.upper()}")
    params.nthread = 1
    return lib.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))


def meta(model, key: str) -> str | None:
    buffer = ctypes.create_string_buffer(1 << 16)
    size = lib.llama_model_meta_val_str(model, key.encode(), buffer, 1 << 16)
    return None if size < 0 else buffer.value.decode("utf-8", "replace")


def tokenize(vocab, text: str) -> list[int]:
    data = text.encode("utf-8")
    room = len(data) + 16
    tokens = (lib.llama_token * room)()
    count = lib.llama_tokenize(vocab, data, len(data), tokens, room, True, True)
    return [tokens[i] for i in range(count)]


def evaluate(context, n_vocab: int, ids: list[int], start: int) -> list:
    """Logits of every position of ids (decoded from position `start`)."""
    batch = lib.llama_batch_init(len(ids), 0, 1)
    batch.n_tokens = len(ids)
    for index, token in enumerate(ids):
        batch.token[index] = token
        batch.pos[index] = start + index
        batch.n_seq_id[index] = 1
        batch.seq_id[index][0] = 0
        batch.logits[index] = 1
    if lib.llama_decode(context, batch) != 0:
        raise RuntimeError("llama_decode failed")
    rows = []
    for index in range(len(ids)):
        pointer = lib.llama_get_logits_ith(context, index)
        rows.append(np.ctypeslib.as_array(pointer, shape=(n_vocab,)).copy())
    lib.llama_batch_free(batch)
    return rows


def run(job: dict) -> dict:
    model_params = lib.llama_model_default_params()
    model = lib.llama_model_load_from_file(job["gguf"].encode(), model_params)
    if not model:
        return {"error": f"llama.cpp could not load {job['gguf']}"}
    vocab = lib.llama_model_get_vocab(model)
    n_vocab = lib.llama_vocab_n_tokens(vocab)
    result = {
        "tokens": [tokenize(vocab, text) for text in job.get("texts", [])],
        "eos": lib.llama_vocab_eos(vocab),
        "eot": lib.llama_vocab_eot(vocab),
        "bos": lib.llama_vocab_bos(vocab),
        "eog": [i for i in job.get("eog_probe", []) if lib.llama_vocab_is_eog(vocab, i)],
        "arch": meta(model, "general.architecture"),
        "chat_prompts": [],
        "logits": [],  # .npy files, one per prompt
        "greedy": [],
    }
    if job.get("chats"):  # the embedded chat template, rendered as llama-cpp-python's chat completions do
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        def piece(token: int) -> str:
            buffer = ctypes.create_string_buffer(256)
            size = lib.llama_token_to_piece(vocab, token, buffer, 256, 0, True)
            return buffer.raw[:size].decode("utf-8", "replace")

        template = meta(model, "tokenizer.chat_template")
        formatter = Jinja2ChatFormatter(
            template, piece(result["eos"]), piece(result["bos"]) if result["bos"] >= 0 else ""
        )
        result["chat_prompts"] = [formatter(messages=chat).prompt for chat in job["chats"]]
    for ids in job.get("prompts", []):
        params = lib.llama_context_default_params()
        params.n_ctx = 256
        params.n_batch = 256
        params.n_threads = 1
        params.n_threads_batch = 1
        context = lib.llama_init_from_model(model, params)
        rows = evaluate(context, n_vocab, ids, 0)
        path = f"{job['out']}-{len(result['logits'])}.npy"
        np.save(path, np.stack(rows))
        result["logits"].append(path)
        generated, position = [], len(ids)
        last = rows[-1]
        for _ in range(job.get("greedy", 0)):
            token = int(np.argmax(last))
            generated.append(token)
            last = evaluate(context, n_vocab, [token], position)[0]
            position += 1
        result["greedy"].append(generated)
        lib.llama_free(context)
    lib.llama_model_free(model)
    return result


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "quantize":
        sys.exit(quantize(*sys.argv[2:]))
    json.dump(run(json.load(sys.stdin)), sys.stdout)
