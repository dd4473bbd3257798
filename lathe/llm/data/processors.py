"""Which batched map function tokenizes a stage's rows (one uniform signature: examples, template, tokenizer,
data_args), and which options a processor takes: media for rows with images, videos or audio (the family plugin's
checks first), `measure` (truncation.py), `notes` (row_notes.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def select_processor(stage: str, packing: bool, generate: bool = False) -> Callable:
    """The batched map function for a stage, with the uniform signature (examples, template, tokenizer, data_args)."""
    if stage == "pt":
        return pretrain
    if stage in ("rm", "dpo"):
        from lathe.llm.data.pairwise import preprocess_pairwise_dataset

        return preprocess_pairwise_dataset
    if stage == "kto":
        from lathe.llm.data.feedback import preprocess_feedback_dataset

        return preprocess_feedback_dataset
    if generate:
        from lathe.llm.data.unsupervised import preprocess_unsupervised_dataset

        return preprocess_unsupervised_dataset
    if packing:
        from lathe.llm.data.packing import preprocess_packed_supervised_dataset

        return preprocess_packed_supervised_dataset
    from lathe.llm.data.supervised import preprocess_supervised_dataset

    return preprocess_supervised_dataset


def pretrain(examples, template, tokenizer, data_args):
    """Stage pt's rows under the uniform signature (the pipeline cuts whole splits into blocks: pretrain.py)."""
    from lathe.llm.data.pretrain import preprocess_pretrain_dataset

    return preprocess_pretrain_dataset(examples, tokenizer, data_args)


def media_options(plan, processor: Callable, dataset) -> dict[str, Any]:
    """The MediaEncoder and the media kinds the split's rows have, for a processor that takes them (plan: the
    pipeline's DataPlan); one line where the stage, packing or the family cannot take them."""
    from lathe.llm.multimodal.encode import media_kinds
    from lathe.llm.multimodal.media import CANONICAL as CANONICAL_COLUMN

    kinds = media_kinds(dataset)
    if not kinds:
        return {}
    if "media" not in parameters(processor):
        what = f"stage {plan.stage}" + (" with packing" if plan.packing else "")
        raise ValueError(f"{what} with images, videos or audio is not supported yet: rows here hold {', '.join(kinds)}")
    if plan.media is None:
        raise ValueError(
            f"the data has {', '.join(kinds)} rows but template {getattr(plan.template, 'name', None)!r} takes no "
            "media: use the model family's multimodal template (e.g. qwen2_vl)"
        )
    counts = {kind: sum(1 for row in dataset[CANONICAL_COLUMN[kind]] if row) for kind in kinds}
    plan.media.plugin.check_kinds(counts, f"dataset(s) {', '.join(a.name for a in plan.train_attrs + plan.eval_attrs)}")
    if plan.packing and plan.stage == "sft":
        plan.media.plugin.check_packing(f"packing / neat_packing with {', '.join(kinds)}")
    return {"media": plan.media, "media_kinds": kinds}


def parameters(processor: Callable):
    import inspect

    return inspect.signature(processor).parameters


def can_measure(processor: Callable) -> bool:
    return "measure" in parameters(processor)
