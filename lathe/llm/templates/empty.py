"""`empty`: the raw text of each message, nothing around it and no EOS (also the fallback when no
template is named and the tokenizer has no chat_template)."""
from lathe.llm.templates.template import Template

TEMPLATES = [Template(name="empty", assistant=("{{content}}",))]
