"""Supervised (sft) examples -> input_ids and labels: which tokens are trained, and truncation.

Labels are -100 on every prompt span (system, user, tool results) and the token ids on every answer
span, EOS included; `train_on_prompt` trains prompts too, `mask_history` only the last answer.
Truncation to cutoff_len splits each turn's budget between prompt and answer as LLaMA-Factory 0.9.5
does (`infer_seqlen`), so the ids are the same token for token. Examples that cannot be encoded (or
whose media a cutoff cuts through) are skipped and counted by reason, never dropped silently; examples
left with no trained token are kept with a warning, as LLaMA-Factory keeps them; with `measure`, each
row also says what cutoff_len cut from it (truncation.py).
"""

from __future__ import annotations

import logging
from collections import Counter

from lathe.llm.data.truncation import ExampleCut, row_columns
from lathe.llm.templates.template import ANSWER_ROLES, PROMPT_ROLES
from lathe.llm.templates.tools import InvalidMessage
from lathe.train.data.labels import IGNORE_INDEX

logger = logging.getLogger("lathe.llm.data")


class SkippedExample(ValueError):
    """An example that is left out of the dataset; `reason` is a short phrase used to count skips."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class MediaCut(SkippedExample):
    """A row whose media run cutoff_len cut; `files`: its media (paths, or what a row holds)."""

    def __init__(self, reason: str, files: list[str]):
        super().__init__(reason)
        self.files = files


def infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """How many prompt (source) and answer (target) tokens of one turn fit in `cutoff_len`.

    A short answer (under half the budget) is kept whole and the prompt is cut; else a short prompt is
    kept whole and the answer cut; else both are cut in proportion to their lengths. The proportional
    case uses float division then int(), as LLaMA-Factory does, so rounding is identical."""
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def check_supervised_example(prompt, response, system, tools, need_response: bool = True) -> None:
    """Raise SkippedExample unless the example has the canonical shape: an odd-length prompt alternating
    user/observation and assistant/function, exactly one assistant/function response (when
    `need_response`), string contents."""
    if not isinstance(prompt, list) or len(prompt) % 2 != 1:
        raise SkippedExample("prompt is not an odd number of messages")
    if need_response and (not isinstance(response, list) or len(response) != 1):
        raise SkippedExample("response is not exactly one message (unsupervised or ranking data)")
    checked = prompt + response if need_response else prompt
    for index, message in enumerate(checked):
        expected = PROMPT_ROLES if index % 2 == 0 else ANSWER_ROLES
        if not isinstance(message, dict) or message.get("role") not in expected:
            raise SkippedExample("message roles do not alternate user/observation and assistant/function")
        if not isinstance(message.get("content"), str):
            raise SkippedExample("message content is not a string")
    if system is not None and not isinstance(system, str):
        raise SkippedExample("system is not a string")
    if tools is not None and not isinstance(tools, str):
        raise SkippedExample("tools is not a JSON string")


def encode_supervised_example(
    prompt,
    response,
    system,
    tools,
    template,
    tokenizer,
    cutoff_len: int,
    train_on_prompt: bool = False,
    mask_history: bool = False,
) -> tuple[list[int], list[int]]:
    """One conversation -> (input_ids, labels), at most cutoff_len tokens.

    Turns are taken in order (last turn first with mask_history, so truncation keeps the end); each turn
    gets what `infer_seqlen` allows of the budget left, and the loop stops once the budget is spent.
    With an efficient_eos template the answers carry no EOS: the first token of each later prompt is
    labelled EOS instead, and one EOS is appended at the end. Raises SkippedExample for a message that
    cannot be encoded (e.g. tool-call JSON that does not parse)."""
    turns = _encode_turns(prompt, response, system, tools, template, tokenizer, mask_history)
    return assemble_turns(
        turns, template.efficient_eos, tokenizer.eos_token_id, cutoff_len, train_on_prompt, mask_history
    )


def measure_supervised_example(
    prompt,
    response,
    system,
    tools,
    template,
    tokenizer,
    cutoff_len: int,
    train_on_prompt: bool = False,
    mask_history: bool = False,
) -> tuple[list[int], list[int], ExampleCut]:
    """`encode_supervised_example`, and what cutoff_len cut from it: tokens and trained tokens before and after."""
    turns = _encode_turns(prompt, response, system, tools, template, tokenizer, mask_history)
    assemble = (template.efficient_eos, tokenizer.eos_token_id)
    input_ids, labels = assemble_turns(turns, *assemble, cutoff_len, train_on_prompt, mask_history)
    trained = len(labels) - labels.count(IGNORE_INDEX)
    full_length = sum(len(source) + len(target) for source, target in turns) + (1 if template.efficient_eos else 0)
    if full_length <= cutoff_len:
        return input_ids, labels, ExampleCut(len(input_ids), len(input_ids), trained, trained)
    _, whole_labels = assemble_turns(turns, *assemble, full_length, train_on_prompt, mask_history)
    return (
        input_ids,
        labels,
        ExampleCut(full_length, len(input_ids), len(whole_labels) - whole_labels.count(IGNORE_INDEX), trained),
    )


def _encode_turns(prompt, response, system, tools, template, tokenizer, mask_history: bool):
    discard_history_thoughts = mask_history and not template.preserve_thinking
    try:
        return template.encode_multiturn(tokenizer, prompt + response, system, tools, discard_history_thoughts)
    except InvalidMessage as error:
        raise SkippedExample(str(error)) from None


def assemble_turns(
    turns, efficient_eos: bool, eos_token_id: int, cutoff_len: int, train_on_prompt: bool, mask_history: bool
) -> tuple[list[int], list[int]]:
    """Encoded turns [(prompt ids, answer ids)] -> (input_ids, labels) within cutoff_len (see above)."""
    if mask_history:
        turns = turns[::-1]  # the last turn first: it gets the budget before the history does

    input_ids: list[int] = []
    labels: list[int] = []
    total_length = 1 if efficient_eos else 0  # room for the final EOS
    for turn_index, (source_ids, target_ids) in enumerate(turns):
        if total_length >= cutoff_len:
            break
        source_len, target_len = infer_seqlen(len(source_ids), len(target_ids), cutoff_len - total_length)
        source_ids, target_ids = source_ids[:source_len], target_ids[:target_len]
        total_length += source_len + target_len

        if train_on_prompt:
            source_labels = list(source_ids)
        elif efficient_eos and turn_index != 0:
            # LLaMA-Factory's rule, kept for identical ids: "turn_index != 0" counts in processing order,
            # so with mask_history it is the earlier turns that get the EOS label, not the last one.
            source_labels = [eos_token_id] + [IGNORE_INDEX] * (source_len - 1)
        else:
            source_labels = [IGNORE_INDEX] * source_len
        if mask_history and turn_index != 0:
            target_labels = [IGNORE_INDEX] * target_len
        else:
            target_labels = list(target_ids)

        if mask_history:  # turns come last-first: prepend to rebuild the conversation order
            input_ids = source_ids + target_ids + input_ids
            labels = source_labels + target_labels + labels
        else:
            input_ids += source_ids + target_ids
            labels += source_labels + target_labels

    if efficient_eos:
        input_ids.append(eos_token_id)
        labels.append(eos_token_id)
    return input_ids, labels


def expand_media(media, examples: dict, index: int, prompt: list, response: list):
    """(prompt, response, media paths, regularized media) of row `index`: the placeholders expanded by the run's
    family plugin (lathe.llm.multimodal.encode.MediaEncoder) when the row has media; unchanged otherwise."""
    if media is None:
        if any(examples.get(column) and examples[column][index] for column in ("_images", "_videos", "_audios")):
            raise ValueError("rows with images, videos or audio need a multimodal template (e.g. qwen2_vl)")
        return prompt, response, {}, {}
    paths = media.row_paths(examples, index)
    if not any(paths.values()):
        return prompt, response, paths, {}
    messages, opened = media.expand(prompt + response, paths)
    return messages[: len(prompt)], messages[len(prompt) :], paths, opened


MEDIA_CUTS_NAMED = 5  # rows left out for a cut media run that are named one by one (per process)
_named_cuts: list[str] = []


def finish_media(media, opened: dict, input_ids: list[int], labels: list[int], paths: dict | None = None):
    """The family's changes to an encoded row with media; SkippedExample when cutoff_len cut a media run (the
    first rows so left out are named by their media files: the count by reason follows in the skip report)."""
    if not opened:
        return input_ids, labels
    input_ids, labels, reason = media.finish(input_ids, labels, opened)
    if reason:
        leave_out_cut_row(reason, paths)
    return input_ids, labels


def leave_out_cut_row(reason: str, paths: dict | None):
    """Raise SkippedExample for a row whose media run cutoff_len cut, naming the first such rows' media files."""
    files = [
        item if isinstance(item, str) else f"a {kind} held in the row"
        for kind, items in (paths or {}).items()
        for item in items or []
    ]
    if files and len(_named_cuts) < MEDIA_CUTS_NAMED:
        _named_cuts.append(files[0])
        logger.warning("left out the row with %s: %s (raise cutoff_len to keep it)", ", ".join(files), reason)
    raise MediaCut(reason, files)


def encode_supervised_examples(
    examples: dict,
    template,
    tokenizer,
    data_args,
    cuts: list | None = None,
    media=None,
    paths: list | None = None,
    notes: list | None = None,
):
    """A batch in the canonical columns (_prompt, _response, _system, _tools) -> the encoded
    (input_ids, labels) pairs of the examples kept, and a Counter of skip reasons for the others.
    `cuts`, when given, receives an ExampleCut per kept example; `paths` each kept row's media paths; `notes` a
    note (lathe.llm.data.row_notes) per row left out for a cut media run or kept with no trained token."""
    from lathe.llm.data.row_notes import media_cut_why, untrained_why

    encoded, skipped, untrained = [], Counter(), 0
    cutoff_len = data_args.cutoff_len
    train_on_prompt = getattr(data_args, "train_on_prompt", False)
    mask_history = getattr(data_args, "mask_history", False)
    count = len(examples["_prompt"])
    systems = examples.get("_system") or [None] * count
    tools = examples.get("_tools") or [None] * count
    rows = zip(examples["_prompt"], examples["_response"], systems, tools)
    for index, (prompt, response, system, tool_text) in enumerate(rows):
        cut = None
        try:
            check_supervised_example(prompt, response, system, tool_text)
            prompt, response, row_paths, opened = expand_media(media, examples, index, prompt, response)
            budget = cutoff_len - (media.prefix_length(opened) if opened else 0)  # PaliGemma's image prefix
            input_ids, labels, cut = measure_supervised_example(
                prompt, response, system, tool_text, template, tokenizer, budget, train_on_prompt, mask_history
            )
            input_ids, labels = finish_media(media, opened, input_ids, labels, row_paths)
        except SkippedExample as skip:
            skipped[skip.reason] += 1
            if notes is not None and isinstance(skip, MediaCut):
                notes.append(
                    {"row": index, "kept": False, "why": media_cut_why(skip.reason, cut, cutoff_len, skip.files)}
                )
            continue
        if all(label == IGNORE_INDEX for label in labels):
            untrained += 1
            if notes is not None:
                notes.append({"row": index, "kept": True, "why": untrained_why(cut, cutoff_len)})
        encoded.append((input_ids, labels))
        if cuts is not None:
            cuts.append(cut)
        if paths is not None:
            paths.append(row_paths)
    if untrained:  # LLaMA-Factory keeps them too: its configs run unchanged, batches keep their shape
        logger.warning(
            "kept %d of %d examples with no trained token left after truncation to cutoff_len=%d, as LLaMA-Factory "
            "keeps them (they add nothing to the loss); raise cutoff_len to train on them",
            untrained,
            count,
            cutoff_len,
        )
    return encoded, skipped


def describe_skips(skipped: Counter, total: int) -> str:
    return f"skipped {sum(skipped.values())} of {total} examples: " + "; ".join(
        f"{count} × {reason}" for reason, count in skipped.most_common()
    )


def report_skips(what: str, batch_skipped: Counter, total: int, skipped: Counter | None) -> None:
    """Warn about the examples a preprocessing batch skipped (by reason), and add them to `skipped`, the
    tally the caller keeps over all batches."""
    if batch_skipped:
        logger.warning("%s preprocessing %s.", what, describe_skips(batch_skipped, total))
        if skipped is not None:
            skipped.update(batch_skipped)


def preprocess_supervised_dataset(
    examples: dict,
    template,
    tokenizer,
    data_args,
    skipped: Counter | None = None,
    measure: bool = False,
    media=None,
    media_kinds: tuple = (),
    notes: list | None = None,
):
    """A batched `datasets.map` function: canonical columns -> input_ids, attention_mask, labels.

    Skipped examples are logged per batch with their reasons and, when `skipped` is given, added to it
    (in-process only: with several map workers, compare row counts before and after). `measure` adds
    truncation.COLUMNS: what cutoff_len cut from each row. `media` (a MediaEncoder) expands the rows' media;
    `media_kinds` are the media columns the rows carry on (images, videos, audios: paths for the collator); `notes`
    receives the rows cut through media or left untrained (lathe.llm.data.row_notes)."""
    cuts: list[ExampleCut] = []
    paths: list[dict] = []
    encoded, batch_skipped = encode_supervised_examples(
        examples, template, tokenizer, data_args, cuts, media, paths, notes
    )
    report_skips("Supervised", batch_skipped, len(examples["_prompt"]), skipped)
    rows = {
        "input_ids": [input_ids for input_ids, _ in encoded],
        "attention_mask": [[1] * len(input_ids) for input_ids, _ in encoded],
        "labels": [labels for _, labels in encoded],
        **media_columns(paths, media_kinds),
    }
    return {**rows, **row_columns([[cut] for cut in cuts])} if measure else rows


def media_columns(paths: list[dict], kinds: tuple) -> dict:
    if not kinds:
        return {}
    from lathe.llm.multimodal.encode import output_columns

    return output_columns(paths, kinds)
