"""Generation rows (predict_with_generate): the prompt to generate from and the reference answer, cut to cutoff_len
as LLaMA-Factory 0.9.5's UnsupervisedDatasetProcessor cuts them; rows with media expanded as supervised rows are."""

from __future__ import annotations

from collections import Counter

from lathe.llm.data.supervised import (
    MediaCut,
    SkippedExample,
    check_supervised_example,
    expand_media,
    infer_seqlen,
    leave_out_cut_row,
    media_columns,
    report_skips,
)
from lathe.llm.data.truncation import ExampleCut, row_columns
from lathe.llm.templates.tools import InvalidMessage


def encode_unsupervised_example(prompt, response, system, tools, template, tokenizer, cutoff_len: int):
    """Prompt-only rows for generation (predict_with_generate): input_ids = the prompt (ending with the
    assistant header), labels = the reference answer's ids (not masked: they are compared to the
    generated text). Without exactly one response, the reference is an empty answer."""
    input_ids, labels, _ = measure_unsupervised_example(
        prompt, response, system, tools, template, tokenizer, cutoff_len
    )
    return input_ids, labels


def measure_unsupervised_example(
    prompt, response, system, tools, template, tokenizer, cutoff_len: int, media=None, opened: dict | None = None
):
    """`encode_unsupervised_example` and what cutoff_len cut from the prompt and the reference answer. With media
    (`opened`: the row's regularized media, placeholders already expanded), the family's token changes (PaliGemma's
    image prefix) come before the cut, as LLaMA-Factory's UnsupervisedDatasetProcessor makes them."""
    reference = response if len(response) == 1 else [{"role": "assistant", "content": ""}]
    try:
        input_ids, labels = template.encode_oneturn(tokenizer, prompt + reference, system, tools)
    except InvalidMessage as error:
        raise SkippedExample(str(error)) from None
    if template.efficient_eos:
        labels = labels + [tokenizer.eos_token_id]
    if opened:
        input_ids, _ = media.plugin.process_token_ids(input_ids, None, opened)
    source_len, target_len = infer_seqlen(len(input_ids), len(labels), cutoff_len)
    cut = ExampleCut(len(input_ids) + len(labels), source_len + target_len, len(labels), target_len)
    return input_ids[:source_len], labels[:target_len], cut


def preprocess_unsupervised_dataset(
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
    """A batched `datasets.map` function for evaluation rows that are generated from: input_ids,
    attention_mask and labels (the reference answer), with skips counted as for supervised rows;
    `measure` as for supervised rows (the labels are the reference answers); `media` and `media_kinds` as for
    supervised rows (a prompt whose media run cutoff_len cuts is left out and named, as in training; `notes` lists
    those rows)."""
    from lathe.llm.data.row_notes import media_cut_why

    model_inputs = {"input_ids": [], "attention_mask": [], "labels": []}
    cuts: list[ExampleCut] = []
    paths: list[dict] = []
    batch_skipped = Counter()
    count = len(examples["_prompt"])
    systems = examples.get("_system") or [None] * count
    tools = examples.get("_tools") or [None] * count
    responses = examples.get("_response") or [[]] * count
    for index, (prompt, response, system, tool_text) in enumerate(zip(examples["_prompt"], responses, systems, tools)):
        cut = None
        try:
            check_supervised_example(prompt, response or [], system, tool_text, need_response=False)
            prompt, response, row_paths, opened = expand_media(media, examples, index, prompt, response or [])
            input_ids, labels, cut = measure_unsupervised_example(
                prompt, response, system, tool_text, template, tokenizer, data_args.cutoff_len, media, opened
            )
            reason = media.plugin.cut_reason(input_ids, opened) if opened else None
            if reason:
                leave_out_cut_row(reason, row_paths)
        except SkippedExample as skip:
            batch_skipped[skip.reason] += 1
            if notes is not None and isinstance(skip, MediaCut):
                why = media_cut_why(skip.reason, cut, data_args.cutoff_len, skip.files)
                notes.append({"row": index, "kept": False, "why": why})
            continue
        cuts.append(cut)
        paths.append(row_paths)
        model_inputs["input_ids"].append(input_ids)
        model_inputs["attention_mask"].append([1] * len(input_ids))
        model_inputs["labels"].append(labels)
    report_skips("Unsupervised", batch_skipped, count, skipped)
    model_inputs.update(media_columns(paths, media_kinds))
    return {**model_inputs, **row_columns([[cut] for cut in cuts])} if measure else model_inputs
