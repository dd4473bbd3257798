"""Pre-training rows (stage pt): documents + EOS, concatenated and cut into cutoff_len blocks, every token kept.

Tokenization follows LLaMA-Factory 0.9.5: each document is its text plus the EOS text (`<|end_of_text|>` for
the llama3 template, whose tokenizer's EOS is the end-of-turn token), tokenized without special tokens.
Two differences, both so that no token is lost:

- LLaMA-Factory cuts every preprocessing batch on its own and drops its tail (`total_length // block_size *
  block_size`): up to cutoff_len - 1 tokens per 1,000 documents. lathe cuts the whole split as one stream
  (`pretrain_blocks`); only the last block of the split may be shorter, and it is kept (the collator pads it).
- For tokenizers that add BOS (`add_bos_token`), LLaMA-Factory overwrites the first token of every block with
  BOS. lathe starts every block with BOS followed by cutoff_len - 1 document tokens.

With `packing: false` every document is its own row ([BOS] + text + EOS); where LLaMA-Factory truncates a
long document to cutoff_len, lathe splits it into several rows.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
from typing import Any

import numpy as np

logger = logging.getLogger("lathe.llm.data")


def adds_bos(tokenizer) -> bool:
    """LLaMA-Factory's test: the tokenizer says it adds BOS (Llama-2/Mistral style tokenizers)."""
    return bool(getattr(tokenizer, "add_bos_token", False)) and tokenizer.bos_token_id is not None


def tokenize_documents(examples: dict, tokenizer, data_args) -> dict[str, list[list[int]]]:
    """A batched map function: one row per document, `input_ids` = the document's tokens + EOS (no BOS).

    A row without text (an empty `_prompt`) is left out and counted in a warning."""
    eos_text = "<|end_of_text|>" if getattr(data_args, "template", None) == "llama3" else tokenizer.eos_token
    if eos_text is None:
        raise ValueError("Pre-training appends EOS to every document, but the tokenizer has no eos_token.")
    texts = [messages[0]["content"] + eos_text for messages in examples["_prompt"] if messages]
    if len(texts) < len(examples["_prompt"]):
        logger.warning(
            "Pre-training skipped %d of %d rows without text.",
            len(examples["_prompt"]) - len(texts),
            len(examples["_prompt"]),
        )
    return {"input_ids": tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []}


def block_content_size(tokenizer, cutoff_len: int) -> int:
    """Document tokens per block: cutoff_len, less one where every block starts with BOS."""
    size = cutoff_len - 1 if adds_bos(tokenizer) else cutoff_len
    if size < 1:
        raise ValueError(f"cutoff_len={cutoff_len} leaves no room for text after BOS; use cutoff_len >= 2.")
    return size


def cut_blocks(tokens: list[int], size: int, bos_id: int | None) -> list[list[int]]:
    """Consecutive pieces of `size` tokens (the last may be shorter), each after BOS when bos_id is given."""
    prefix = [] if bos_id is None else [bos_id]
    return [prefix + tokens[start : start + size] for start in range(0, len(tokens), size)]


def preprocess_pretrain_dataset(examples: dict, tokenizer, data_args) -> dict[str, list[list[int]]]:
    """The contract's batch function: the documents of `examples` -> `input_ids` blocks.

    With packing, the batch is one stream cut into blocks of cutoff_len (the last may be shorter). Applied to
    a whole split in one call it gives the same rows as `pretrain_blocks`; applied batch by batch through
    `datasets.map` it would leave a short block at every batch end, which is why the pipeline calls
    `pretrain_blocks` instead."""
    documents = tokenize_documents(examples, tokenizer, data_args)["input_ids"]
    size = block_content_size(tokenizer, data_args.cutoff_len)
    bos_id = tokenizer.bos_token_id if adds_bos(tokenizer) else None
    if getattr(data_args, "packing", True) is False:
        return unpacked_rows(documents, tokenizer, data_args.cutoff_len)
    return {"input_ids": cut_blocks(list(itertools.chain.from_iterable(documents)), size, bos_id)}


def unpacked_rows(documents: list[list[int]], tokenizer, cutoff_len: int) -> dict[str, list[list[int]]]:
    """packing: false: [BOS] + document + EOS per row, a long document split over several rows."""
    prefix = [tokenizer.bos_token_id] if adds_bos(tokenizer) else []
    rows = []
    for document in documents:
        rows += cut_blocks(prefix + document, cutoff_len, None)
    return {"input_ids": rows}


def pretrain_blocks(dataset, tokenizer, data_args, map_kwargs: dict[str, Any]):
    """A whole split of canonical rows -> a Dataset of blocks, cut from the concatenation of all its
    documents, so that no block boundary depends on preprocessing_batch_size or the number of workers.

    Two `datasets.map` passes: the first tokenizes each document (batched, in parallel); the second gives
    every batch of documents the blocks that *start* inside it, reading the following documents for a
    block that runs past the batch's end. Every block is written exactly once and only the last block
    of the split may be shorter than cutoff_len. `map_kwargs` are the pipeline's `map` arguments for the
    final rows (batch_size, num_proc, cache_file_name, new_fingerprint, ...); the tokenized documents go
    to a sibling file that is deleted once the blocks are written.
    """
    import functools

    if getattr(data_args, "packing", True) is False:
        function = functools.partial(preprocess_pretrain_dataset, tokenizer=tokenizer, data_args=data_args)
        return dataset.map(function, batched=True, remove_columns=dataset.column_names, **map_kwargs)

    documents_kwargs = dict(map_kwargs)
    if map_kwargs.get("cache_file_name"):
        stem, extension = os.path.splitext(map_kwargs["cache_file_name"])
        documents_kwargs["cache_file_name"] = f"{stem}-documents{extension}"
    if map_kwargs.get("new_fingerprint"):
        fingerprint = map_kwargs["new_fingerprint"]
        digest = hashlib.sha256(f"{fingerprint}-documents".encode()).hexdigest()
        documents_kwargs["new_fingerprint"] = digest[: len(fingerprint)]
    documents_kwargs["desc"] = "Tokenizing documents"
    documents = dataset.map(
        functools.partial(tokenize_documents, tokenizer=tokenizer, data_args=data_args),
        batched=True,
        remove_columns=dataset.column_names,
        **documents_kwargs,
    )

    import pyarrow.compute as compute

    lengths = compute.list_value_length(documents.with_format("arrow")[:]["input_ids"])
    lengths = lengths.to_numpy(zero_copy_only=False)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])  # document i = stream[offsets[i]:offsets[i+1]]
    cut = functools.partial(
        _blocks_starting_in_batch,
        documents=documents,
        offsets=offsets,
        size=block_content_size(tokenizer, data_args.cutoff_len),
        bos_id=tokenizer.bos_token_id if adds_bos(tokenizer) else None,
    )
    blocks = documents.map(cut, batched=True, with_indices=True, remove_columns=documents.column_names, **map_kwargs)
    for item in documents.cache_files:
        if item["filename"] not in {block_file["filename"] for block_file in blocks.cache_files}:
            try:
                os.remove(item["filename"])
            except OSError:  # best effort: a leftover file only costs disk in the cache entry
                pass
    return blocks


def _blocks_starting_in_batch(
    batch: dict, indices: list[int], documents, offsets: np.ndarray, size: int, bos_id: int | None
) -> dict[str, list[list[int]]]:
    """The blocks whose first token belongs to the documents `indices` (consecutive, as map gives them)."""
    first, stop = indices[0], indices[-1] + 1
    begin, end, total = int(offsets[first]), int(offsets[stop]), int(offsets[-1])
    starts = range(-(-begin // size) * size, end, size)  # multiples of size in [begin, end)
    if not starts:
        return {"input_ids": []}
    needed_end = min(starts[-1] + size, total)
    # Documents after the batch, up to the one holding the last needed token.
    after = max(int(np.searchsorted(offsets, needed_end, side="left")), stop)
    stream = list(itertools.chain.from_iterable(batch["input_ids"]))
    if after > stop:
        stream += itertools.chain.from_iterable(documents[stop:after]["input_ids"])
    prefix = [] if bos_id is None else [bos_id]
    return {"input_ids": [prefix + stream[start - begin : start - begin + size] for start in starts]}
