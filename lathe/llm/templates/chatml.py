"""`chatml`: OpenAI's ChatML (<|im_start|>role ... <|im_end|>); <|im_end|> becomes the EOS."""
from lathe.llm.templates.template import Template

TEMPLATES = [
    Template(
        name="chatml",
        user=("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n",),
        assistant=("{{content}}<|im_end|>\n",),
        system=("<|im_start|>system\n{{content}}<|im_end|>\n",),
        observation=("<|im_start|>tool\n{{content}}<|im_end|>\n<|im_start|>assistant\n",),
        stop_words=("<|im_end|>", "<|im_start|>"),
        replace_eos=True,
        replace_jinja_template=True,
    ),
]
