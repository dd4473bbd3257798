"""`Template`: a chat format as data (slots per role), and how it turns a conversation into token ids.

A slot list is the text around one message: strings where `{{content}}` is replaced by the message, and
`SpecialToken`s put in by id (the tokenizer's BOS/EOS, or a named token). Every string element is
tokenized on its own (`add_special_tokens=False`), exactly as LLaMA-Factory 0.9.5 does, so that the ids
of a prompt never depend on the response that follows it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Optional

from lathe.llm.templates.slots import BOS, CONTENT, EOS, Slots, SpecialToken  # noqa: F401 (Template's vocabulary)
from lathe.llm.templates.tools import InvalidMessage, describe_tools, format_function_message, get_tool_format

logger = logging.getLogger("lathe.llm.templates")

USER, ASSISTANT, SYSTEM, FUNCTION, OBSERVATION = "user", "assistant", "system", "function", "observation"
PROMPT_ROLES = (USER, OBSERVATION)  # even message positions
ANSWER_ROLES = (ASSISTANT, FUNCTION)  # odd message positions


@dataclass
class Template:
    """One chat format. Fields left as None take LLaMA-Factory's defaults in `__post_init__`:
    assistant = content + EOS (content only with `efficient_eos`), system = content,
    observation = the user slots, function = the assistant slots."""

    name: str
    user: Slots = (CONTENT,)
    assistant: Optional[Slots] = None
    system: Slots = (CONTENT,)
    observation: Optional[Slots] = None
    function: Optional[Slots] = None
    prefix: Slots = ()
    default_system: str = ""
    stop_words: tuple[str, ...] = ()
    tool_format: str = "default"
    thought_words: tuple[str, str] = ("<think>\n", "\n</think>\n\n")
    tool_call_words: tuple[str, str] = ("<tool_call>", "</tool_call>")
    # The assistant slots carry no EOS; the processor trains EOS on the first token of the next prompt
    # (and appends one EOS at the very end) instead.
    efficient_eos: bool = False
    replace_eos: bool = False  # stop_words[0] becomes the tokenizer's EOS
    replace_jinja_template: bool = False  # overwrite a tokenizer's own chat_template with this one
    # Llama-2 / Mistral style: the system text is the first system slot, prepended to the first user
    # message's content; tool calls are plain JSON (no thought / tool-call words parsed).
    system_in_first_user: bool = False
    # Reasoning (<think>) templates: an empty thought is added where an answer has none.
    reasoning: bool = False
    enable_thinking: Optional[bool] = True
    preserve_thinking: bool = False
    # The empty thought's text; None: both thought words (GLM-4.7 writes only the closing one).
    empty_thought: Optional[str] = None
    # Phi-4-mini style: the raw tools JSON goes into these slots' {{content}} instead of a tool format's
    # description (a data_args.tool_format switches back to the format's description).
    raw_tools_slot: Optional[str] = None
    # The multimodal plugin LLaMA-Factory pairs with this template (e.g. "qwen2_vl"); lathe trains such
    # templates on text and refuses image / video / audio data.
    multimodal: str = ""

    def __post_init__(self):
        default_answer = (CONTENT,) if self.efficient_eos else (CONTENT, EOS)
        if self.assistant is None:
            self.assistant = default_answer
        if self.observation is None:
            self.observation = self.user
        if self.function is None:
            self.function = self.assistant
        for role in ("user", "assistant", "system", "observation", "function"):
            if not any(isinstance(s, str) and CONTENT in s for s in getattr(self, role)):
                raise ValueError(f"Template {self.name!r}: the {role} slots need a {CONTENT} placeholder.")

    def copy(self, **changes) -> "Template":
        return dataclasses.replace(self, **changes)

    # ---- encoding ---------------------------------------------------------------------------------
    def encode_oneturn(self, tokenizer, messages, system=None, tools=None) -> tuple[list[int], list[int]]:
        """All messages but the last -> prompt ids; the last -> response ids."""
        messages = self._prepare_thoughts(messages, oneturn=True)
        encoded = self._encode(tokenizer, messages, system, tools)
        prompt_ids = [token for ids in encoded[:-1] for token in ids]
        response_ids = encoded[-1]
        if self.reasoning and not self._has_thought(messages[-1]["content"]):
            if self.enable_thinking:  # the empty thought is part of what the model learns to write
                response_ids = self._empty_thought_ids(tokenizer) + response_ids
            else:
                prompt_ids = prompt_ids + self._empty_thought_ids(tokenizer)
        return prompt_ids, response_ids

    def encode_multiturn(self, tokenizer, messages, system=None, tools=None, discarding_history_cot=False):
        """Messages -> [(prompt ids, response ids)] per turn; turn 0's prompt carries prefix and system."""
        messages = self._prepare_thoughts(messages, oneturn=False, discarding_history_cot=discarding_history_cot)
        encoded = self._encode(tokenizer, messages, system, tools)
        if self.reasoning:
            turns = [len(messages) - 2] if discarding_history_cot else range(0, len(messages), 2)
            for i in turns:
                if not self._has_thought(messages[i + 1]["content"]):
                    if self.enable_thinking:
                        encoded[i + 1] = self._empty_thought_ids(tokenizer) + encoded[i + 1]
                    else:
                        encoded[i] = encoded[i] + self._empty_thought_ids(tokenizer)
        return [(encoded[i], encoded[i + 1]) for i in range(0, len(encoded), 2)]

    def _encode(self, tokenizer, messages, system, tools) -> list[list[int]]:
        return [self._elements_to_ids(tokenizer, elements) for elements in self._elements(messages, system, tools)]

    def _elements(self, messages, system, tools) -> list[list]:
        """Each message's slot elements, the first message's with the prefix and the system text."""
        system = system or self.default_system
        encoded = []
        for index, message in enumerate(messages):
            elements: list = []
            content = message["content"]
            if index == 0:
                elements += self.prefix
                if system or tools:
                    system_text = system + (self._tools_text(tools) if tools else "")
                    if self.system_in_first_user:
                        # the first system slot only (a string), as the start of the user's content
                        content = _fill(self.system, system_text)[0] + content
                    else:
                        elements += _fill(self.system, system_text)
            role = message["role"]
            if self.multimodal and not message.get("media_expanded"):  # marked by lathe.llm.multimodal.encode
                _refuse_media_placeholders(self, index, content)
            if role == USER:
                elements += _fill(self.user, content)
            elif role == ASSISTANT:
                elements += _fill(self.assistant, content)
            elif role == OBSERVATION:
                elements += _fill(self.observation, content)
            elif role == FUNCTION:
                words = (None, None) if self.system_in_first_user else (self.thought_words, self.tool_call_words)
                elements += _fill(self.function, format_function_message(content, self.tool_format, *words))
            else:
                raise InvalidMessage(f"unexpected role {role!r}")
            encoded.append(elements)
        return encoded

    def _tools_text(self, tools: str) -> str:
        if self.raw_tools_slot is not None:
            return self.raw_tools_slot.replace(CONTENT, tools, 1)
        return describe_tools(self.tool_format, tools)

    def render_oneturn(self, tokenizer, messages, system=None, tools=None) -> tuple[str, str]:
        """`encode_oneturn` as text, before tokenization: what a chat_template must render for the model to
        see at inference what it was trained on (the prompt, and the answer that follows it)."""
        messages = self._prepare_thoughts(messages, oneturn=True)
        texts = [
            "".join(s if isinstance(s, str) else _special_text(s, tokenizer) for s in elements)
            for elements in self._elements(messages, system, tools)
        ]
        prompt, response = "".join(texts[:-1]), texts[-1]
        if self.reasoning and not self._has_thought(messages[-1]["content"]):
            if self.enable_thinking:
                response = self.empty_thought_text() + response
            else:
                prompt += self.empty_thought_text()
        return prompt, response

    @staticmethod
    def _elements_to_ids(tokenizer, elements) -> list[int]:
        ids: list[int] = []
        for element in elements:
            if isinstance(element, str):
                if element:
                    ids += tokenizer.encode(element, add_special_tokens=False)
            elif element.kind == "token":
                ids.append(tokenizer.convert_tokens_to_ids(element.text))
            else:
                token_id = tokenizer.bos_token_id if element.kind == "bos" else tokenizer.eos_token_id
                if token_id is not None:
                    ids.append(token_id)
        return ids

    # ---- reasoning ----------------------------------------------------------------------------------
    def _thought_pattern(self):
        return re.compile(f"{re.escape(self.thought_words[0])}(.*?){re.escape(self.thought_words[1])}", re.DOTALL)

    def remove_thought(self, content: str) -> str:
        return self._thought_pattern().sub("", content).lstrip("\n")

    def _has_thought(self, content: str) -> bool:
        start, end = (word.strip() for word in self.thought_words)
        return start in content or end in content

    def empty_thought_text(self) -> str:
        return self.thought_words[0] + self.thought_words[1] if self.empty_thought is None else self.empty_thought

    def _empty_thought_ids(self, tokenizer) -> list[int]:
        return tokenizer.encode(self.empty_thought_text(), add_special_tokens=False)

    def _prepare_thoughts(self, messages, oneturn: bool, discarding_history_cot: bool = False):
        """Reasoning templates drop thoughts from history answers (and from all answers when thinking
        is disabled); other templates leave messages untouched."""
        if not self.reasoning:
            return messages
        messages = [dict(message) for message in messages]
        last = len(messages) - 1
        if oneturn:
            strip = [] if self.preserve_thinking else range(1, last - 1, 2)
            strip = list(strip) + ([last] if self.enable_thinking is False else [])
        else:
            strip = list(range(1, last + 1, 2)) if self.enable_thinking is False else []
            if discarding_history_cot:
                strip += range(1, last - 1, 2)
        for i in strip:
            messages[i]["content"] = self.remove_thought(messages[i]["content"])
        return messages

    # ---- tokenizer ----------------------------------------------------------------------------------
    def get_stop_token_ids(self, tokenizer) -> list[int]:
        """EOS first, then each stop word's id, without repeats (generation_config's eos_token_id)."""
        ids = [tokenizer.eos_token_id] + [tokenizer.convert_tokens_to_ids(word) for word in self.stop_words]
        return list(dict.fromkeys(i for i in ids if i is not None))

    def fix_special_tokens(self, tokenizer) -> None:
        """Make the tokenizer agree with the template: EOS (stop_words[0] when replace_eos, else
        <|endoftext|> when it has none), PAD (= EOS when missing), the other stop words as special tokens."""
        stop_words = list(self.stop_words)
        if self.replace_eos:
            if not stop_words:
                raise ValueError(f"Template {self.name!r}: replace_eos needs stop words.")
            _set_eos_token(tokenizer, stop_words.pop(0))
        if tokenizer.eos_token_id is None:
            _set_eos_token(tokenizer, "<|endoftext|>")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
            logger.info("Add pad token: %s", tokenizer.pad_token)
        if stop_words:
            added = _add_extra_special_tokens(tokenizer, stop_words)
            logger.info("Add %s to stop words.", ",".join(stop_words))
            if added:
                logger.warning("New tokens were added to the tokenizer: the model's embeddings must be resized.")

    def jinja_chat_template(self, tokenizer) -> str:
        from lathe.llm.templates.jinja import build_jinja_chat_template

        return build_jinja_chat_template(self, tokenizer)

    def extract_tool(self, content: str):
        return get_tool_format(self.tool_format).extract_calls(content)


MEDIA_PLACEHOLDERS = ("<image>", "<video>", "<audio>")


def _refuse_media_placeholders(template: Template, index: int, content: str) -> None:
    """LLaMA-Factory's multimodal plugins refuse a placeholder without its media (a row with media has its
    placeholders expanded before the template encodes it: lathe.llm.multimodal)."""
    for placeholder in MEDIA_PLACEHOLDERS:
        if placeholder in content:
            raise InvalidMessage(
                f"message {index + 1} holds the {placeholder} placeholder but the row gives no "
                f"{placeholder.strip('<>')} (template {template.name!r}): list its file in the dataset's "
                f"{placeholder.strip('<>')}s column"
            )


def _special_text(element: SpecialToken, tokenizer) -> str:
    if element.kind == "token":
        return element.text
    token_id = tokenizer.bos_token_id if element.kind == "bos" else tokenizer.eos_token_id
    return "" if token_id is None else (tokenizer.bos_token if element.kind == "bos" else tokenizer.eos_token)


def _fill(slots: Slots, content: str) -> list:
    """Slots with the first {{content}} of each string replaced by `content`."""
    return [s.replace(CONTENT, content, 1) if isinstance(s, str) else s for s in slots]


def _set_eos_token(tokenizer, eos_token: str) -> None:
    if tokenizer.eos_token == eos_token:
        return
    previous = tokenizer.eos_token
    added = tokenizer.add_special_tokens({"eos_token": eos_token})
    logger.info("%s eos token: %s.", "Add" if previous is None else "Replace", eos_token)
    if added:
        logger.warning("New tokens were added to the tokenizer: the model's embeddings must be resized.")


def _add_extra_special_tokens(tokenizer, tokens: list[str]) -> int:
    """Add tokens as special without dropping the tokenizer's existing extra special tokens (the keyword
    is `replace_extra_special_tokens` in transformers 5, `replace_additional_special_tokens` in 4)."""
    for keyword in ("replace_extra_special_tokens", "replace_additional_special_tokens"):
        try:
            return tokenizer.add_special_tokens({"additional_special_tokens": tokens}, **{keyword: False})
        except TypeError:
            continue
    return tokenizer.add_special_tokens({"additional_special_tokens": tokens})
