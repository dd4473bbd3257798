"""`default`: plain "Human: / Assistant:" turns, each closed by the tokenizer's EOS."""
from lathe.llm.templates.template import EOS, Template

TEMPLATES = [
    Template(
        name="default",
        user=("Human: {{content}}", EOS, "\nAssistant:"),
        assistant=("{{content}}", EOS, "\n"),
        system=("System: {{content}}", EOS, "\n"),
        replace_jinja_template=True,
    ),
]
