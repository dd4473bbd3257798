"""The memory plan's terms for a vision-language model: the media tokens are part of the rows (the text terms count
them); here the vision tower's activations for the patches behind them, kept for backward when the tower or the
projector trains (LLaMA-Factory's default freezes both: then the tower runs forward only and keeps nothing)."""

from __future__ import annotations


def media_tokens_per_row(model, dataset) -> int:
    """The most image / video tokens one training row holds (counted in arrow)."""
    config = getattr(model, "config", None)
    ids = [getattr(config, name, None) for name in ("image_token_id", "video_token_id")]
    ids = [token for token in ids if token is not None]
    columns = [name for name in ("input_ids", "chosen_input_ids") if name in dataset.column_names]
    if not ids or not columns or len(dataset) == 0:
        return 0
    table = dataset.with_format("arrow")[:]
    most = 0
    for column in columns:
        for row in table[column].to_pylist():  # rows are few thousand at most in a plan's look; ids are ints
            most = max(most, sum(1 for token in row if token in ids))
    return most


def vision_activation_bytes(model, batch: int, media_tokens: int, element: int) -> tuple[int, str | None]:
    """(bytes kept for backward by the vision tower and projector, a note) for `batch` rows of `media_tokens`."""
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None)
    if vision is None or media_tokens == 0:
        return 0, None
    from lathe.llm.multimodal.towers import composite_of

    composite = composite_of(model)
    hidden = int(getattr(vision, "hidden_size", None) or getattr(vision, "embed_dim", 0))
    mlp = int(getattr(vision, "intermediate_size", 0) or hidden * getattr(vision, "mlp_ratio", 4))
    depth = int(getattr(vision, "depth", None) or getattr(vision, "num_hidden_layers", 0))
    merge = int(getattr(vision, "spatial_merge_size", 1))
    patches = batch * media_tokens * merge**2
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    tower = composite is not None and any(any(key in name for key in composite.vision_keys) for name in trained)
    projector = composite is not None and any(any(key in name for key in composite.projector_keys) for name in trained)
    kept = 0
    if tower:  # per patch and block: norms, q/k/v, attention output, the MLP's input and hidden (Qwen2-VL layout)
        kept += patches * depth * (8 * hidden + 2 * mlp) * element
    if tower or projector:  # the merger: its input (merge^2 patches per token) and its hidden layer
        kept += batch * media_tokens * (2 * hidden * merge**2) * element
    what = "trains" if tower else ("frozen, projector trains" if projector else "frozen: forward only")
    note = f"vision tower: {media_tokens} media tokens per row ({media_tokens * merge**2} patches), {what}"
    return kept, note


def add_vision_terms(plan, model, settings, dataset) -> None:
    """The vision terms added to a MemoryPlan (activations and peak) with a note saying what they cover."""
    if plan is None or dataset is None or getattr(getattr(model, "config", None), "vision_config", None) is None:
        return
    from lathe.llm.memory.preference import rows_per_forward

    tokens = media_tokens_per_row(model, dataset)
    kept, note = vision_activation_bytes(
        model, rows_per_forward(settings.stage, settings.batch), tokens, 2 if settings.half else 4
    )
    plan.activations += kept
    plan.activations_other += kept
    plan.peak += kept
    if note:
        plan.notes.append(note)
