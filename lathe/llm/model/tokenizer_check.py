"""The check that a loaded tokenizer encodes text as its folder's own tokenizer.json does (transformers 5
may pick a model-specific class that rebuilds the tokenizer and silently encodes every row differently)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["check_tokenizer_matches_file", "TokenizerMismatchError"]

SAMPLE = "Hello world! The quick brown fox jumps over 13 lazy dogs.\n  Ünïcödé 你好 — ok?"
VOCAB_SAMPLES = 24  # tokens of the file's own vocabulary added to the sample, spread over its ids


class TokenizerMismatchError(ValueError):
    """The loaded tokenizer and the folder's tokenizer.json encode the same text differently."""


def _vocabulary_words(reference) -> str:
    """Words of the file's own vocabulary, spread over its ids, so a tokenizer whose vocabulary has no
    English words (a word-level or character-level one) is still tested on text it knows."""
    size = reference.get_vocab_size(with_added_tokens=False)
    step = max(size // VOCAB_SAMPLES, 1)
    words = [reference.decode([index]) for index in range(0, size, step)][:VOCAB_SAMPLES]
    return " ".join(word for word in words if word.strip())


def _reference_encoding(reference) -> tuple[str, list[int]] | None:
    """(sample, ids) from tokenizer.json; the fixed text is left out for a vocabulary without an unknown
    token that cannot encode it; None when the file cannot encode even its own words."""
    words = _vocabulary_words(reference)
    for text in (SAMPLE + " " + words, words):
        try:
            return text, reference.encode(text, add_special_tokens=False).ids
        except Exception:  # tokenizers raises a bare Exception (e.g. WordLevel without an unknown token)
            continue
    return None


def _model_kind(backend) -> str:
    return type(getattr(backend, "model", None)).__name__


def check_tokenizer_matches_file(tokenizer, folder: str) -> None:
    """Raise TokenizerMismatchError naming the folder and what disagreed when `tokenizer` does not encode
    a sample as `folder`/tokenizer.json does. Only fast (tokenizers-backed) tokenizers are checked: they
    claim to be that file; a folder without tokenizer.json has nothing to compare with."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file() or not getattr(tokenizer, "is_fast", False):
        return
    from tokenizers import Tokenizer

    try:
        reference = Tokenizer.from_file(str(path))
    except Exception as error:  # the library's own parse error: any exception type
        raise TokenizerMismatchError(f"{path} cannot be read by the tokenizers library: {error}") from error
    encoded = _reference_encoding(reference)
    if encoded is None:
        return
    text, expected = encoded
    raised = ""
    try:
        loaded = tokenizer(text, add_special_tokens=False)["input_ids"]
    except Exception as error:  # the loaded tokenizer cannot encode what tokenizer.json encodes
        loaded, raised = [], f" (the loaded tokenizer raised {type(error).__name__}: {error})"
    if list(loaded) == list(expected):
        return
    first = next((i for i, (a, b) in enumerate(zip(loaded, expected)) if a != b), min(len(loaded), len(expected)))
    raise TokenizerMismatchError(
        f"The tokenizer loaded from {folder} ({type(tokenizer).__name__}, a {_model_kind(tokenizer.backend_tokenizer)} "
        f"model) does not encode text as the folder's tokenizer.json ({_model_kind(reference)} model) does: "
        f"{len(loaded)} tokens instead of {len(expected)}, first difference at token {first} "
        f"(loaded {list(loaded[first : first + 6])}, tokenizer.json {list(expected[first : first + 6])}) on the "
        f"sample {text[:80]!r}{raised}. transformers chose {type(tokenizer).__name__}{_model_type_note(folder)}, which "
        "rebuilds the tokenizer instead of using tokenizer.json, so every row would be encoded differently. Use "
        "a tokenizer of the kind that class expects, or a model_type whose tokenizer class reads tokenizer.json as "
        "it is."
    )


def _model_type_note(folder: str) -> str:
    config = Path(folder) / "config.json"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return ""
    return f" for model_type {model_type!r} (config.json)" if model_type else ""
