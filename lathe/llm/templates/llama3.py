"""Llama 3.x: header tokens per role, <|eot_id|> ends a turn (and becomes the EOS), tool results come
back as the `ipython` role."""
from lathe.llm.templates.template import BOS, Template

TEMPLATES = [
    Template(
        name="llama3",
        user=(
            "<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        assistant=("{{content}}<|eot_id|>",),
        system=("<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>",),
        function=("{{content}}<|eot_id|>",),
        observation=(
            "<|start_header_id|>ipython<|end_header_id|>\n\n{{content}}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        prefix=(BOS,),
        tool_format="llama3",
        stop_words=("<|eot_id|>", "<|eom_id|>"),
        replace_eos=True,
    ),
]
