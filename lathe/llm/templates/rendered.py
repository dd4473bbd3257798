"""`template: null` with a chat_template that marks its assistant turns with {% generation %} blocks: the
conversation is rendered by the chat_template itself and the trained spans are its assistant masks
(transformers' `return_assistant_tokens_mask`), so no slot has to be guessed.

Each marked span is one answer; the unmarked tokens before it are that turn's prompt. Unmarked tokens after
the last answer (a closing newline) are never trained and nothing follows them, so they are left out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from lathe.llm.templates.template import ANSWER_ROLES, FUNCTION, OBSERVATION, Template
from lathe.llm.templates.tools import InvalidMessage

GENERATION_BLOCK = re.compile(r"{%-?\s*generation\s*-?%}")


def has_generation_blocks(chat_template) -> bool:
    return isinstance(chat_template, str) and GENERATION_BLOCK.search(chat_template) is not None


def _tool_calls(content: str) -> list[dict]:
    try:
        calls = json.loads(content)
    except json.JSONDecodeError as error:
        raise InvalidMessage(f"function call is not valid JSON ({error.msg})") from None
    calls = calls if isinstance(calls, list) else [calls]
    return [{"type": "function", "function": call} for call in calls]


def _chat(messages, system) -> list[dict]:
    chat = [{"role": "system", "content": system}] if system else []
    for message in messages:
        if message["role"] == OBSERVATION:
            chat.append({"role": "tool", "content": message["content"]})
        elif message["role"] == FUNCTION:
            chat.append({"role": "assistant", "content": "", "tool_calls": _tool_calls(message["content"])})
        else:
            chat.append(dict(message))
    return chat


@dataclass
class RenderedTemplate(Template):
    """A Template whose encoding is the tokenizer's own chat_template with its assistant masks."""

    def _render(self, tokenizer, messages, system, tools, generation_prompt=False):
        try:
            return tokenizer.apply_chat_template(
                _chat(messages, system),
                tools=json.loads(tools) if tools else None,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=not generation_prompt,
                add_generation_prompt=generation_prompt,
            )
        except InvalidMessage:
            raise
        except Exception as error:  # the chat_template refused the conversation (roles, tools, ...)
            raise InvalidMessage(f"the tokenizer's chat_template cannot render this conversation ({error})") from None

    def encode_multiturn(self, tokenizer, messages, system=None, tools=None, discarding_history_cot=False):
        rendered = self._render(tokenizer, messages, system, tools)
        ids, mask = list(rendered["input_ids"]), list(rendered["assistant_masks"])
        pairs, start, position = [], 0, 0
        while position < len(ids):
            if mask[position]:
                end = position
                while end < len(ids) and mask[end]:
                    end += 1
                pairs.append((ids[start:position], ids[position:end]))
                start = position = end
            else:
                position += 1
        answers = sum(message["role"] in ANSWER_ROLES for message in messages)
        if len(pairs) != answers:
            raise InvalidMessage(
                f"the chat_template's {{% generation %}} blocks mark {len(pairs)} spans for {answers} answers"
            )
        return pairs

    def encode_oneturn(self, tokenizer, messages, system=None, tools=None):
        prompt = list(self._render(tokenizer, messages[:-1], system, tools, generation_prompt=True)["input_ids"])
        if not messages[-1]["content"]:  # the prompt to generate from
            return prompt, []
        pairs = self.encode_multiturn(tokenizer, messages, system, tools)
        full = [token for pair in pairs for ids in pair for token in ids]
        if full[: len(prompt)] != prompt:
            raise InvalidMessage("the chat_template's generation prompt is not where its last answer starts")
        return prompt, full[len(prompt) :]

    def jinja_chat_template(self, tokenizer) -> str:
        return tokenizer.chat_template  # the chat_template is the definition of this template

    def render_oneturn(self, tokenizer, messages, system=None, tools=None) -> tuple[str, str]:
        prompt, answer = self.encode_oneturn(tokenizer, messages, system, tools)
        return tokenizer.decode(prompt), tokenizer.decode(answer)
