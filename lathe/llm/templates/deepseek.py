"""DeepSeek: deepseek (V1/V2 "User: / Assistant:"), deepseekcoder, deepseek3 (<｜User｜> / <｜Assistant｜>) and
the reasoning deepseekr1."""

from lathe.llm.templates.template import BOS, Template

_V3 = dict(user=("<｜User｜>{{content}}<｜Assistant｜>",), prefix=(BOS,))

TEMPLATES = [
    Template(name="deepseek", user=("User: {{content}}\n\nAssistant:",), system=("{{content}}\n\n",), prefix=(BOS,)),
    Template(
        name="deepseekcoder",
        user=("### Instruction:\n{{content}}\n### Response:",),
        assistant=("\n{{content}}\n<|EOT|>\n",),
        prefix=(BOS,),
        default_system=(
            "You are an AI programming assistant, utilizing the DeepSeek Coder model, "
            "developed by DeepSeek Company, and you only answer questions related to computer science. "
            "For politically sensitive questions, security and privacy issues, "
            "and other non-computer science questions, you will refuse to answer.\n"
        ),
    ),
    Template(name="deepseek3", **_V3),
    Template(name="deepseekr1", reasoning=True, **_V3),
]
