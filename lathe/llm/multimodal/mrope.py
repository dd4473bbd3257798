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


def packed_rope_positions(model, input_ids, example_positions, inputs: dict, token_ids: list[int], merge_length: int):
    """mrope positions (3, batch, length) of packed rows: get_rope_index on each example alone (an example starts
    where `example_positions` is 0; the collator's padding is one more), given the grids of the images and
    videos in it, taken in order: LLaMA-Factory's neat packing (`_compute_rope_position_ids_with_packing`).
    token_ids: the image and the video token's ids; merge_length: vision tokens per merged patch group."""
    import torch

    queues = {
        token: [int(item.prod()) // merge_length for item in grid] if grid is not None else []
        for token, grid in zip(token_ids, (inputs.get("image_grid_thw"), inputs.get("video_grid_thw")))
    }
    taken = dict.fromkeys(token_ids, 0)
    rows = []
    for row in range(input_ids.shape[0]):
        starts = torch.nonzero(example_positions[row] == 0).flatten().tolist() + [input_ids.shape[-1]]
        pieces = []
        for start, end in zip(starts[:-1], starts[1:]):
            ids = input_ids[row : row + 1, start:end]
            span = {}  # token -> (first, last) index into its grid of this example's items
            for token in token_ids:
                first, tokens = taken[token], int((ids == token).sum())
                while tokens > 0:
                    tokens -= queues[token][taken[token]]
                    taken[token] += 1
                span[token] = (first, taken[token])
            image, video = (span[token] for token in token_ids)
            seconds = inputs.get("second_per_grid_ts")
            positions, _ = rope_positions(
                model,
                ids,
                torch.ones_like(ids),
                inputs["image_grid_thw"][image[0] : image[1]] if image[1] > image[0] else None,
                inputs["video_grid_thw"][video[0] : video[1]] if video[1] > video[0] else None,
                seconds[video[0] : video[1]] if seconds is not None and video[1] > video[0] else None,
            )
            pieces.append(positions)
        rows.append(torch.cat(pieces, dim=-1))
    return torch.cat(rows, dim=1)
