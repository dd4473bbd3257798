"""Qwen2-VL's 3-D rotary positions ("mrope": temporal, height, width) from the model's own get_rope_index: for a
padded batch, and for packed rows, one packed example at a time (the Qwen2-VL family's collator, lathe chat)."""

from __future__ import annotations


def rope_index_function(model):
    """The model's get_rope_index (on the model, or on its inner model since transformers 4.52; a PEFT
    wrapper is looked through), or None for a model without mrope."""
    if model is None:
        return None
    base = getattr(model, "base_model", None)
    if base is not None and hasattr(base, "model") and type(model).__name__.startswith("Peft"):
        model = base.model
    if hasattr(model, "get_rope_index"):
        return model.get_rope_index
    inner = getattr(model, "model", None)
    return getattr(inner, "get_rope_index", None)


def rope_positions(model, input_ids, attention_mask, image_grid_thw=None, video_grid_thw=None, second_per_grid_ts=None):
    """(position_ids of shape (3, batch, length), rope_deltas) for a padded batch, from the model's get_rope_index
    (image tokens marked 1 and video tokens 2 in mm_token_type_ids, as transformers 5 asks; Qwen2.5-VL's video
    frames spaced by second_per_grid_ts)."""
    import inspect

    import torch

    if attention_mask.sum() == 0:  # a batch of padding only: plain positions on every axis
        length = input_ids.shape[-1]
        positions = torch.arange(length).view(1, 1, length).expand(3, *input_ids.shape).contiguous()
        return positions, torch.zeros(input_ids.shape[0])
    get_rope_index = rope_index_function(model)
    if get_rope_index is None:
        raise ValueError(f"{type(model).__name__} has no get_rope_index: it is not a Qwen2-VL family model")
    kwargs = {
        "input_ids": input_ids,
        "image_grid_thw": image_grid_thw,
        "video_grid_thw": video_grid_thw,
        "attention_mask": (attention_mask >= 1).float(),
    }
    if second_per_grid_ts is not None:
        kwargs["second_per_grid_ts"] = second_per_grid_ts
    if "mm_token_type_ids" in inspect.signature(get_rope_index).parameters:
        config = model.config
        token_types = torch.zeros_like(input_ids)
        for token_id, kind in (
            (getattr(config, "image_token_id", None), 1),
            (getattr(config, "video_token_id", None), 2),
        ):
            if token_id is not None:
                token_types[input_ids == token_id] = kind
        kwargs["mm_token_type_ids"] = token_types
    return get_rope_index(**kwargs)


def packed_rope_positions(input_ids, example_positions, queues: dict, rope):
    """mrope positions (3, batch, length) of packed rows: each example alone (an example starts where
    `example_positions` is 0; the collator's padding is one more), as LLaMA-Factory's neat packing does
    (`_compute_rope_position_ids_with_packing`). queues: a media token id -> how many of it each item of that kind
    holds, in the batch's order; rope(ids, spans) gives the positions (3, 1, n) of one example's ids, spans: token id
    -> (first, end) indexes of the example's items in its queue."""
    import torch

    taken = dict.fromkeys(queues, 0)
    rows = []
    for row in range(input_ids.shape[0]):
        starts = torch.nonzero(example_positions[row] == 0).flatten().tolist() + [input_ids.shape[-1]]
        pieces = []
        for start, end in zip(starts[:-1], starts[1:]):
            ids = input_ids[row : row + 1, start:end]
            spans = {}
            for token, counts in queues.items():
                first, tokens = taken[token], int((ids == token).sum())
                while tokens > 0:
                    tokens -= counts[taken[token]]
                    taken[token] += 1
                spans[token] = (first, taken[token])
            pieces.append(rope(ids, spans))
        rows.append(torch.cat(pieces, dim=-1))
    return torch.cat(rows, dim=1)


def sliced(values, span: tuple[int, int]):
    """values[first:end] of a span, or None where the example holds none of them (get_rope_index's "no media")."""
    return values[span[0] : span[1]] if values is not None and span[1] > span[0] else None
