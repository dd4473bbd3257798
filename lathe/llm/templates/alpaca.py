"""`alpaca`: Stanford Alpaca's "### Instruction: / ### Response:" format with its default system text."""
from lathe.llm.templates.template import EOS, Template

TEMPLATES = [
    Template(
        name="alpaca",
        user=("### Instruction:\n{{content}}\n\n### Response:\n",),
        assistant=("{{content}}", EOS, "\n\n"),
        default_system=(
            "Below is an instruction that describes a task. "
            "Write a response that appropriately completes the request.\n\n"
        ),
        replace_jinja_template=True,
    ),
]
