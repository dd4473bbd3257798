"""The tokenizer as GGUF metadata, so llama.cpp tokenizes exactly as the Hugging Face tokenizer does.

Two kinds of tokenizer.json are written:
- byte-level BPE (Llama 3, Qwen2/2.5/3, GPT-2 style): `tokenizer.ggml.model = gpt2`, the vocabulary and
  merges as they are, and the pre-tokenizer named as llama.cpp names it. llama.cpp's own converter
  recognises a pre-tokenizer by hashing how a published tokenizer encodes a probe text; lathe reads the
  pre-tokenizer itself (its split regex and whether merges are ignored), which also holds for a tokenizer
  with added or retrained tokens. A regex llama.cpp does not implement is an error naming it.
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral v0.x, Gemma, Phi-3):
  `tokenizer.ggml.model = llama`; llama.cpp merges the highest-scoring pair first, so each token's score
  is minus the rank of the merge that makes it; `add_space_prefix` follows the tokenizer's normalizer
  (Llama 2 prepends "▁", Gemma does not).
Special tokens: BOS/EOS/UNK/PAD ids, whether BOS/EOS are added, and EOT = the template's other stop token
(`generation_config.json`'s eos_token_id list, which `lathe export` writes from the template).
"""

from __future__ import annotations

import json
import os
import re

from lathe.llm.gguf.architectures import UnsupportedModel
from lathe.llm.gguf.package import gguf_package

# The split regex of each byte-level pre-tokenizer llama.cpp implements (its src/llama-vocab.cpp), as
# tokenizer.json writes it -> llama.cpp's name (for llama3's regex: by whether merges are ignored).
_LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
PRE_TOKENIZERS = {_QWEN2_SPLIT: "qwen2", _GPT2_SPLIT: "gpt-2"}
SPACE = "\u2581"
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def write_tokenizer(writer, folder: str, vocab_size: int, chat_template: str | None) -> dict:
    """Write the folder's tokenizer into the GGUF; returns the facts written (for the report and tests)."""
    from transformers import AutoTokenizer

    gguf = gguf_package()
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise UnsupportedModel(
            f"export_gguf: {folder} has no tokenizer.json (a fast tokenizer): llama.cpp's vocabulary is written from it."
        )
    with open(path, encoding="utf-8") as handle:
        spec = json.load(handle)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise UnsupportedModel(
            f"export_gguf: the tokenizer's model is {model.get('type')!r}: lathe writes BPE tokenizers "
            "(byte-level or SentencePiece-style with byte fallback) as GGUF."
        )
    added = {entry["id"]: entry for entry in spec.get("added_tokens", [])}
    vocab = dict(model["vocab"])
    for token_id, entry in added.items():
        vocab[entry["content"]] = token_id
    if max(vocab.values()) >= vocab_size:
        raise UnsupportedModel(
            f"export_gguf: the tokenizer has token id {max(vocab.values())} but the model's vocab_size is {vocab_size}."
        )
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in model.get("merges", [])]
    spm = bool(model.get("byte_fallback"))
    if spm:
        facts = _write_sentencepiece(writer, spec, vocab, added, merges, vocab_size, tokenizer, gguf)
    else:
        facts = _write_byte_level(writer, spec, vocab, added, merges, vocab_size, gguf)
    facts.update(_write_special_tokens(writer, tokenizer, folder))
    if chat_template:
        writer.add_chat_template(chat_template)
    return facts


def _texts(vocab: dict, vocab_size: int) -> list[str]:
    texts = [f"[PAD{i}]" for i in range(vocab_size)]
    for text, token_id in vocab.items():
        texts[token_id] = text
    return texts


def _added_type(entry: dict, gguf) -> int:
    text = entry["content"]
    looks_special = text.startswith("<|") and text.endswith("|>")
    return gguf.TokenType.CONTROL if entry.get("special") or looks_special else gguf.TokenType.USER_DEFINED


def _write_byte_level(writer, spec, vocab, added, merges, vocab_size, gguf) -> dict:
    pre = _pre_tokenizer_name(spec)
    texts = _texts(vocab, vocab_size)
    types = [gguf.TokenType.UNUSED] * vocab_size
    for token_id in vocab.values():
        types[token_id] = _added_type(added[token_id], gguf) if token_id in added else gguf.TokenType.NORMAL
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(texts)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    return {"model": "gpt2", "pre": pre}


def _pre_tokenizer_name(spec: dict) -> str:
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    splits = [step for step in steps if step.get("type") == "Split"]
    levels = [step for step in steps if step.get("type") == "ByteLevel"]
    if len(splits) == 1 and levels and not levels[0].get("use_regex", True):
        regex = splits[0].get("pattern", {}).get("Regex")
        if regex == _LLAMA3_SPLIT:
            return "llama-bpe" if spec["model"].get("ignore_merges") else "smaug-bpe"
        if regex in PRE_TOKENIZERS and not spec["model"].get("ignore_merges"):
            return PRE_TOKENIZERS[regex]
        raise UnsupportedModel(
            f"export_gguf: the tokenizer's pre-tokenizer regex {regex!r} is not one llama.cpp implements "
            "(Llama 3's, Qwen2's or GPT-2's)."
        )
    if not splits and len(levels) == 1 and levels[0].get("use_regex", True):
        if levels[0].get("add_prefix_space"):
            raise UnsupportedModel("export_gguf: a byte-level pre-tokenizer with add_prefix_space is not supported.")
        return "gpt-2"
    raise UnsupportedModel(
        f"export_gguf: the tokenizer's pre-tokenizer ({json.dumps(pre)[:200]}) is not one llama.cpp implements."
    )


def _write_sentencepiece(writer, spec, vocab, added, merges, vocab_size, tokenizer, gguf) -> dict:
    texts = _texts(vocab, vocab_size)
    rank = {}
    for index, merge in enumerate(merges):
        left, right = merge.split(" ", 1)
        rank.setdefault(left + right, index)
    scores = [-1e9] * vocab_size
    types = [gguf.TokenType.UNUSED] * vocab_size
    unk = spec["model"].get("unk_token")
    for text, token_id in vocab.items():
        if token_id in added and not _BYTE_TOKEN.fullmatch(text):
            types[token_id] = _added_type(added[token_id], gguf)
            scores[token_id] = -1000.0
            continue
        if text in rank:
            scores[token_id] = -float(rank[text])
        elif len(text) == 1:
            scores[token_id] = 0.0
        if text == unk:
            types[token_id] = gguf.TokenType.UNKNOWN
        elif _BYTE_TOKEN.fullmatch(text):
            types[token_id] = gguf.TokenType.BYTE
        else:
            types[token_id] = gguf.TokenType.NORMAL
    prefix = _adds_space_prefix(spec)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(texts)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(prefix)
    return {"model": "llama", "pre": "default", "add_space_prefix": prefix}


def _adds_space_prefix(spec: dict) -> bool:
    """Llama 2 style (Prepend "▁" + Replace " " by "▁", or a Metaspace that prepends) -> True; Gemma style
    (Replace only) -> False. Anything else llama.cpp's SentencePiece tokenizer does not do is an error."""

    def flatten(step):
        if not step:
            return []
        if step.get("type") == "Sequence":
            inner = step.get("normalizers") or step.get("pretokenizers") or []
            return [item for part in inner for item in flatten(part)]
        return [step]

    normalizers = flatten(spec.get("normalizer"))
    pre = flatten(spec.get("pre_tokenizer"))
    kinds = [step["type"] for step in normalizers + pre]
    replaces = [s for s in normalizers if s["type"] == "Replace" and s.get("content") == SPACE]
    prepends = [s for s in normalizers if s["type"] == "Prepend" and s.get("prepend") == SPACE]
    metaspace = [s for s in pre if s["type"] == "Metaspace"]
    allowed = {"Replace", "Prepend", "Metaspace", "Split"}
    if set(kinds) - allowed or (not replaces and not metaspace):
        raise UnsupportedModel(
            f"export_gguf: a SentencePiece-style tokenizer with {kinds or 'no normalizer'} is not one "
            "llama.cpp's tokenizer reproduces (it replaces spaces by '▁' and may prepend one)."
        )
    if metaspace:
        return metaspace[0].get("prepend_scheme", "always") in ("always", "first")
    return bool(prepends)


def _write_special_tokens(writer, tokenizer, folder: str) -> dict:
    facts = {}
    for kind in ("bos", "eos", "unk", "pad"):
        token_id = getattr(tokenizer, f"{kind}_token_id")
        if token_id is not None:
            getattr(writer, f"add_{kind}_token_id")(token_id)
            facts[kind] = token_id
    probe = tokenizer("a")["input_ids"]
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    add_bos = tokenizer.bos_token_id is not None and len(probe) > len(bare) and probe[0] == tokenizer.bos_token_id
    add_eos = tokenizer.eos_token_id is not None and len(probe) > len(bare) and probe[-1] == tokenizer.eos_token_id
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    facts.update(add_bos=add_bos, add_eos=add_eos)
    stops = _stop_ids(folder)
    others = [token_id for token_id in stops if token_id != tokenizer.eos_token_id]
    if others:
        writer.add_eot_token_id(others[0])
        facts["eot"] = others[0]
    facts["stops"] = stops
    return facts


def _stop_ids(folder: str) -> list[int]:
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as handle:
        ids = json.load(handle).get("eos_token_id")
    return [ids] if isinstance(ids, int) else list(ids or [])
