"""The vocabulary of a template's slots: the text placeholder for a message's content ({{content}}) and the
special tokens a slot may hold (BOS, EOS, a named token). A leaf: template.py and the Jinja writer (jinja.py)
both build on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

CONTENT = "{{content}}"


@dataclass(frozen=True)
class SpecialToken:
    """A slot element encoded by id, never through the text encoder: `BOS`, `EOS` (the tokenizer's own,
    skipped when it has none) or `SpecialToken("token", "<x>")` (looked up by name)."""

    kind: str  # "bos" | "eos" | "token"
    text: str = ""


BOS = SpecialToken("bos")
EOS = SpecialToken("eos")
Slots = tuple[Union[str, SpecialToken], ...]
