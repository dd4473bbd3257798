"""Chat templates as data: `Template`, the registry of named templates and `get_template_and_fix_tokenizer`."""

from lathe.llm.templates.registry import (
    TEMPLATES,
    get_template,
    register_template,
    template_names,
)
from lathe.llm.templates.resolve import get_template_and_fix_tokenizer
from lathe.llm.templates.template import BOS, EOS, SpecialToken, Template
from lathe.llm.templates.tools import FunctionCall, InvalidMessage

__all__ = [
    "BOS",
    "EOS",
    "FunctionCall",
    "InvalidMessage",
    "SpecialToken",
    "TEMPLATES",
    "Template",
    "get_template",
    "get_template_and_fix_tokenizer",
    "register_template",
    "template_names",
]
