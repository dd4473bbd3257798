"""`python -m lathe.llm.templates`: print the name of every registered chat template, one a line."""

from lathe.llm.templates.registry import template_names

print("\n".join(template_names()))
