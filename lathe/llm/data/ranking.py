"""Preference data in the canonical schema: ranking rows (a chosen and a rejected answer to one prompt)
and KTO rows (one answer tagged desirable or not) become a `_response` of two assistant messages, laid out
as LLaMA-Factory 0.9.5 lays them out: ranking [chosen, rejected]; KTO [answer, ""] when the tag is true and
["", answer] when it is false. Which stage may read which kind of data is decided here too.

Where LLaMA-Factory trains on a broken pair (an empty or missing side, an answer with a user role, two
identical answers, which teach nothing) or drops a KTO row without a true/false tag, lathe skips the row
and reports it with its file and row, as for sft rows.
"""

from __future__ import annotations

from typing import Any

from lathe.llm.data.converters import ANSWER_ROLES, ASSISTANT, RowProblem, tag_roles, type_name
from lathe.llm.data.registry import DatasetAttr

PAIRWISE_STAGES = ("rm", "dpo")  # one pipeline: LLaMA-Factory tokenizes dpo data as stage rm


def check_stage_data(attr: DatasetAttr, stage: str) -> None:
    """Ranking data for rm/dpo only, and only ranking data there; KTO-tagged data for kto only, and only it."""
    where = attr.where()
    if stage in PAIRWISE_STAGES and not attr.ranking:
        raise ValueError(
            f'{where}: stage {stage} trains on ranking data ("ranking": true with chosen and '
            f"rejected columns); this dataset is not."
        )
    if stage not in PAIRWISE_STAGES and attr.ranking:
        raise ValueError(f"{where}: ranking data is for stage rm or dpo, not stage {stage}.")
    if stage == "kto" and not attr.kto_tag:
        raise ValueError(
            f"{where}: stage kto needs a 'kto_tag' column (true: a desirable answer, false: an "
            f"undesirable one) named in `columns`."
        )
    if stage != "kto" and attr.kto_tag:
        raise ValueError(f"{where}: data with a 'kto_tag' column is for stage kto, not stage {stage}.")


def preference_answers(row: dict[str, Any], example: dict[str, Any], attr: DatasetAttr) -> list[dict[str, str]]:
    """The two-message `_response` of a ranking or KTO row; raises RowProblem for a broken one."""
    if attr.kto_tag:
        return _kto_answers(row, example, attr)
    chosen, rejected = _ranked_answer(example, attr, "chosen"), _ranked_answer(example, attr, "rejected")
    if chosen == rejected:
        raise RowProblem(
            "identical answers",
            f"columns '{attr.chosen}' (chosen) and '{attr.rejected}' (rejected) "
            f"hold the same answer: the pair prefers nothing",
        )
    return [chosen, rejected]


def _ranked_answer(example: dict[str, Any], attr: DatasetAttr, side: str) -> dict[str, str]:
    column = getattr(attr, side)
    value = example.get(column)
    what = f"column '{column}' ({side})"
    if value is None:
        raise RowProblem("missing answer", f"{what} is missing")
    if attr.formatting == "alpaca":
        if not isinstance(value, str):
            raise RowProblem("wrong type", f"{what} is {type_name(value)}, expected a string")
        message = {"role": ASSISTANT, "content": value}
    else:
        message = _answer_message(value, what, attr)
    if not message["content"]:
        raise RowProblem("empty answer", f"{what} is empty")
    return message


def _answer_message(value: Any, what: str, attr: DatasetAttr) -> dict[str, str]:
    """A sharegpt/openai answer: one message object whose role is the assistant's (or a function call)."""
    if not isinstance(value, dict):
        raise RowProblem(
            "wrong type",
            f"{what} is {type_name(value)}, expected one message object with "
            f"'{attr.role_tag}' and '{attr.content_tag}'",
        )
    roles = tag_roles(attr)
    role = roles.get(value.get(attr.role_tag))
    if role not in ANSWER_ROLES:
        raise RowProblem(
            "wrong role",
            f"{what} has {attr.role_tag} {value.get(attr.role_tag)!r}; an answer needs "
            f"the assistant tag {attr.assistant_tag!r} (or {attr.function_tag!r})",
        )
    content = value.get(attr.content_tag)
    if not isinstance(content, str):
        raise RowProblem(
            "wrong type", f"{what} content ('{attr.content_tag}') is {type_name(content)}, expected a string"
        )
    return {"role": role, "content": content}


def _kto_answers(row: dict[str, Any], example: dict[str, Any], attr: DatasetAttr) -> list[dict[str, str]]:
    tag = example.get(attr.kto_tag)
    if not isinstance(tag, bool):
        raise RowProblem(
            "missing kto_tag",
            f"column '{attr.kto_tag}' (kto_tag) is {type_name(tag)}, expected "
            f"true (desirable answer) or false (undesirable)",
        )
    if len(row["_response"]) != 1:
        raise RowProblem(
            "missing answer", f"the row has no answer to tag (column '{attr.response}' or the last message)"
        )
    answer = row["_response"][0]
    if not answer["content"]:
        raise RowProblem("empty answer", "the tagged answer is empty")
    empty = {"role": ASSISTANT, "content": ""}
    return [answer, empty] if tag else [empty, answer]
