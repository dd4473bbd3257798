"""Dataset formats (alpaca, sharegpt, openai) -> the canonical conversation schema.

Canonical row: `_prompt` (odd number of messages, user/observation at even positions, assistant/function
at odd ones, ending with a user/observation turn), `_response` (one assistant/function message; empty
for unsupervised data), `_system` and `_tools` (strings, "" when none). The conversion rules are
LLaMA-Factory 0.9.5's; where it logs and drops a row (or crashes), lathe records why, skips the row,
and reports how many rows were skipped with the file and row of the first ones.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from lathe.llm.data.registry import DatasetAttr

logger = logging.getLogger("lathe.llm.data")

USER, ASSISTANT, SYSTEM, FUNCTION, OBSERVATION = "user", "assistant", "system", "function", "observation"
PROMPT_ROLES, ANSWER_ROLES = (USER, OBSERVATION), (ASSISTANT, FUNCTION)
CANONICAL_COLUMNS = ("_prompt", "_response", "_system", "_tools")
PROBLEM_COLUMN = "_problem"
EXAMPLES_SHOWN = 5  # rows quoted in a skip report


class RowProblem(Exception):
    """A malformed row: `kind` groups rows in the report, the message says exactly what is wrong."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


def type_name(value: Any) -> str:
    return (
        "null"
        if value is None
        else {"str": "string", "dict": "object", "list": "list"}.get(type(value).__name__, type(value).__name__)
    )


MEDIA_PARTS = ("image", "image_url", "video", "video_url", "audio", "input_audio", "audio_url")
MULTIMODAL = "multimodal"  # the problem kind that stops the run instead of skipping the row


def _text(value: Any, what: str, allow_none: bool = True) -> str | None:
    """A string field: str passes, None passes when allowed, anything else is a wrong-type row (content
    parts with an image, video or audio are refused: the formats name media in their own columns)."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:  # "\ud800" written in a JSON file: no tokenizer can take it
                raise RowProblem(
                    "invalid text",
                    f"{what} holds {value[error.start]!r}, a lone surrogate that is not a Unicode character",
                ) from None
        return value
    if value is None and allow_none:
        return value
    if value is None:
        raise RowProblem("missing value", f"{what} is missing")
    media = [part.get("type") for part in value if isinstance(part, dict)] if isinstance(value, list) else []
    if any(kind in MEDIA_PARTS for kind in media):
        raise RowProblem(
            MULTIMODAL,
            f"{what} holds {'/'.join(k for k in media if k in MEDIA_PARTS)} content parts, which LLaMA-Factory's "
            "formats do not read: write <image> (<video>, <audio>) in the text and list the files in the images "
            "(videos, audios) column of dataset_info.json",
        )
    raise RowProblem("wrong type", f"{what} is {type_name(value)}, expected a string")


def _tools_text(value: Any, column: str) -> str:
    """Tools may be written as JSON text or as JSON itself; the schema keeps text (LLaMA-Factory dumps
    only the openai format's; a list left as is would crash its template later)."""
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return _text(json.dumps(value, ensure_ascii=False), f"column '{column}'")
    return _text(value, f"column '{column}'")


def _column(example: dict[str, Any], column: str | None) -> Any:
    return example.get(column) if column else None


def convert_alpaca(example: dict[str, Any], attr: DatasetAttr) -> dict[str, Any]:
    """instruction + "\\n" + input as the user turn, output as the answer, history pairs before them."""
    prompt = []
    history = _column(example, attr.history)
    if history is not None:
        if not isinstance(history, list):
            raise RowProblem(
                "wrong type",
                f"column '{attr.history}' (history) is {type_name(history)}, "
                f"expected a list of [prompt, response] pairs",
            )
        for turn, pair in enumerate(history, start=1):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise RowProblem(
                    "wrong type",
                    f"history item {turn} is {type_name(pair)}"
                    f"{' of length %d' % len(pair) if isinstance(pair, list) else ''}, "
                    f"expected a [prompt, response] pair",
                )
            prompt.append({"role": USER, "content": _text(pair[0], f"history item {turn} prompt", False)})
            prompt.append({"role": ASSISTANT, "content": _text(pair[1], f"history item {turn} response", False)})
    parts = []
    for role in ("prompt", "query"):
        value = _text(_column(example, getattr(attr, role)), f"column '{getattr(attr, role)}' ({role})")
        if value:  # empty parts are left out, as in LLaMA-Factory: "prompt\nquery"
            parts.append(value)
    prompt.append({"role": USER, "content": "\n".join(parts)})
    answer = _text(_column(example, attr.response), f"column '{attr.response}' (response)")
    return {
        "_prompt": prompt,
        "_response": [] if answer is None else [{"role": ASSISTANT, "content": answer}],
        "_system": _text(_column(example, attr.system), f"column '{attr.system}' (system)") or "",
        "_tools": _tools_text(_column(example, attr.tools), attr.tools),
    }


def _messages(example: dict[str, Any], attr: DatasetAttr) -> list[dict[str, Any]]:
    """The messages column, checked: a list of objects, each with a role and string content."""
    messages = example.get(attr.messages)
    if not isinstance(messages, list):
        raise RowProblem(
            "wrong type", f"column '{attr.messages}' (messages) is {type_name(messages)}, expected a list of messages"
        )
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, dict):
            raise RowProblem(
                "wrong type",
                f"message {number} is {type_name(message)}, expected an object "
                f"with '{attr.role_tag}' and '{attr.content_tag}'",
            )
        if message.get(attr.role_tag) is None:
            hint = ""
            if attr.role_tag == "from" and "role" in message:
                hint = (
                    "; the messages look OpenAI-style: set tags {role_tag: role, content_tag: content, "
                    "user_tag: user, assistant_tag: assistant, system_tag: system} in dataset_info.json"
                )
            raise RowProblem("missing key", f"message {number} has no '{attr.role_tag}' (role_tag){hint}")
    return messages


def _split_system(messages: list[dict[str, Any]], example: dict[str, Any], attr: DatasetAttr) -> tuple[list, str]:
    """A first message with the system tag is the system prompt; otherwise the system column is."""
    if attr.system_tag and messages and messages[0][attr.role_tag] == attr.system_tag:
        return messages[1:], _text(messages[0].get(attr.content_tag), "message 1 (system) content", False)
    return messages, _text(_column(example, attr.system), f"column '{attr.system}' (system)") or ""


def _check_turns(
    aligned: list[dict[str, str]], tags: list[str], offset: int, role_tag: str, ranking: bool = False
) -> None:
    """Alternation (user/observation, then assistant/function, ...) and an even count (odd for ranking
    data, whose answers are in the chosen and rejected columns)."""
    if not aligned:
        raise RowProblem("empty conversation", "the conversation has no messages besides the system prompt")
    for index, message in enumerate(aligned):
        expected = PROMPT_ROLES if index % 2 == 0 else ANSWER_ROLES
        if message["role"] not in expected:
            raise RowProblem(
                "wrong role order",
                f"message {index + 1 + offset} has {role_tag} '{tags[index]}' "
                f"({message['role']}) where {' or '.join(expected)} is expected "
                f"(turns must alternate, starting with the user)",
            )
    if ranking and not len(aligned) % 2:
        count = len(aligned)
        raise RowProblem(
            "even number of turns",
            f"the conversation ends with a {aligned[-1]['role']} turn ({count} "
            f"messages): ranking data ends with the prompt, the answers are "
            f"in the chosen and rejected columns",
        )
    if len(aligned) % 2 and not ranking:
        count = len(aligned)
        raise RowProblem(
            "odd number of turns",
            f"the conversation ends with a {aligned[-1]['role']} turn "
            f"({count} message{'s' if count > 1 else ''}): it must end with an answer",
        )


def tag_roles(attr: DatasetAttr) -> dict[str, str]:
    tags = {
        attr.user_tag: USER,
        attr.assistant_tag: ASSISTANT,
        attr.observation_tag: OBSERVATION,
        attr.function_tag: FUNCTION,
        attr.system_tag: SYSTEM,
    }
    tags.pop(None, None)
    return tags


def _role(tag: Any, roles: dict[str, str], number: int, attr: DatasetAttr) -> str:
    if not isinstance(tag, str) or tag not in roles:  # a list or object as the tag is no role either
        raise RowProblem(
            "unknown role",
            f"message {number} has {attr.role_tag} '{tag}', which is none of the "
            f"tags {', '.join(repr(t) for t in roles)}",
        )
    return roles[tag]


def _prompt_and_response(aligned: list[dict[str, str]], ranking: bool = False) -> dict[str, Any]:
    if ranking:  # the answers come from the chosen and rejected columns (lathe.llm.data.ranking)
        return {"_prompt": aligned, "_response": []}
    return {"_prompt": aligned[:-1], "_response": aligned[-1:]}


def convert_sharegpt(example: dict[str, Any], attr: DatasetAttr) -> dict[str, Any]:
    """Role tags mapped to roles; alternation checked on the tags, as in LLaMA-Factory."""
    messages, system = _split_system(_messages(example, attr), example, attr)
    offset = 1 if len(messages) < len(example[attr.messages]) else 0
    roles = tag_roles(attr)
    aligned = []
    for index, message in enumerate(messages):
        number = index + 1 + offset
        role = _role(message[attr.role_tag], roles, number, attr)
        content = _text(message.get(attr.content_tag), f"message {number} content ('{attr.content_tag}')", False)
        aligned.append({"role": role, "content": content})
    _check_turns(aligned, [message[attr.role_tag] for message in messages], offset, attr.role_tag, attr.ranking)
    return {
        **_prompt_and_response(aligned, attr.ranking),
        "_system": system,
        "_tools": _tools_text(_column(example, attr.tools), attr.tools),
    }


def convert_openai(example: dict[str, Any], attr: DatasetAttr) -> dict[str, Any]:
    """OpenAI messages: assistant `tool_calls` become a function turn (the calls' `function` objects as
    JSON), consecutive tool results merge into one observation turn. LLaMA-Factory 0.9.5 also appends
    "detailed thinking off" to the system prompt of examples without tools (a newline to those with
    tools); lathe keeps the system prompt as the data gives it."""
    messages, system = _split_system(_messages(example, attr), example, attr)
    offset = 1 if len(messages) < len(example[attr.messages]) else 0
    roles = tag_roles(attr)
    aligned, tags, tool_results = [], [], []
    for index, message in enumerate(messages):
        number = index + 1 + offset
        tag = message[attr.role_tag]
        content = message.get(attr.content_tag)
        if tag in (attr.assistant_tag, attr.function_tag) and message.get("tool_calls"):
            calls = message["tool_calls"]
            if not isinstance(calls, list) or not all(
                isinstance(call, dict) and isinstance(call.get("function"), dict) for call in calls
            ):
                raise RowProblem(
                    "wrong type", f"message {number} tool_calls must be a list of {{'function': {{...}}}} objects"
                )
            content = json.dumps([call["function"] for call in calls], ensure_ascii=False)
            tag = attr.function_tag
        content = _text(content, f"message {number} content ('{attr.content_tag}')", False)
        if tag is not None and tag == attr.observation_tag:
            tool_results.append(content)
            continue
        if tool_results:
            aligned.append({"role": OBSERVATION, "content": "\n</tool_response>\n<tool_response>\n".join(tool_results)})
            tags.append(attr.observation_tag)
            tool_results = []
        aligned.append({"role": _role(tag, roles, number, attr), "content": content})
        tags.append(tag)
    # Tool results after the last message are dropped, as in LLaMA-Factory: nothing answers them.
    _check_turns(aligned, tags, offset, attr.role_tag, attr.ranking)
    return {
        **_prompt_and_response(aligned, attr.ranking),
        "_system": system,
        "_tools": _tools_text(_column(example, attr.tools), attr.tools),
    }


CONVERTERS: dict[str, Callable[[dict[str, Any], DatasetAttr], dict[str, Any]]] = {
    "alpaca": convert_alpaca,
    "sharegpt": convert_sharegpt,
    "openai": convert_openai,
}


@dataclass
class ConversionReport:
    """What the conversion of one dataset kept and skipped, and why."""

    dataset: str
    total: int = 0
    skipped: int = 0
    reasons: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # "file row N: detail", the first few

    def summary(self) -> str:
        reasons = ", ".join(f"{count} {kind}" for kind, count in self.reasons.most_common())
        lines = [f"dataset '{self.dataset}': skipped {self.skipped} of {self.total} rows ({reasons})"]
        lines += [f"  {example}" for example in self.examples]
        if self.skipped > len(self.examples):
            lines.append(f"  ... and {self.skipped - len(self.examples)} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "total": self.total,
            "skipped": self.skipped,
            "reasons": dict(self.reasons),
            "examples": list(self.examples),
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ConversionReport":
        return cls(
            values["dataset"], values["total"], values["skipped"], Counter(values["reasons"]), list(values["examples"])
        )
