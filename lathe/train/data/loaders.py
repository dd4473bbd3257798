"""The Trainer's dataloaders: column pruning by the model's signature, item checks, and the
resumable samplers of lathe.train.data.sampling, configured from TrainingArguments. The functions that take
`trainer` first are Trainer's methods of the same name (trainer.py lists them)."""

from __future__ import annotations

from lathe.train.data import columns
from lathe.train.data import sampling as data


def signature_columns(model, label_names: list[str]) -> list[str]:
    """The dataset columns model.forward takes (PEFT models: their base model's)."""
    inner = getattr(model, "get_base_model", lambda: model)()
    return columns.signature_columns(inner, label_names)


def build_dataloader(trainer, dataset, description: str, batch_size: int, train: bool):
    args = trainer.args
    collate = trainer.data_collator
    if args.remove_unused_columns:
        trainer._set_signature_columns_if_needed()  # a subclass (TRL) may name its own columns there
        dataset, collate = columns.prune_unused_columns(
            dataset, collate, trainer._signature_columns, description, type(trainer.model).__name__
        )
    if trainer._default_collator_used:
        columns.validate_first_item(dataset)
    strategy = getattr(args.train_sampling_strategy, "value", args.train_sampling_strategy)
    return data.build_dataloader(
        dataset,
        batch_size=batch_size,
        collate_fn=collate,
        # Under group_by_length, "shuffled" asks data.build_dataloader for transformers' train order (global RNG).
        shuffle=train and strategy in ("random", "group_by_length"),
        seed=args.data_seed if args.data_seed is not None else args.seed,
        drop_last=args.dataloader_drop_last,
        num_workers=args.dataloader_num_workers,
        pin_memory=args.dataloader_pin_memory,
        persistent_workers=args.dataloader_persistent_workers,
        prefetch_factor=args.dataloader_prefetch_factor,
        multiprocessing_context=args.dataloader_multiprocessing_context,
        in_order=args.dataloader_in_order,
        group_by_length=strategy == "group_by_length",  # evaluation too, as transformers' _get_eval_sampler
        length_column_name=args.length_column_name,
        model_input_name=trainer.main_input_name,
        length_group_size=batch_size * (args.gradient_accumulation_steps if train else 1),
        num_shards=args.world_size,
        shard_index=args.process_index,
    )


def set_signature_columns_if_needed(trainer) -> None:
    """transformers' Trainer._set_signature_columns_if_needed: the columns model.forward takes, once."""
    if getattr(trainer, "_signature_columns", None) is None:
        trainer._signature_columns = signature_columns(trainer.model, trainer.label_names)


def remove_unused_columns(trainer, dataset, description: str | None = None):
    """transformers' Trainer._remove_unused_columns: a `datasets.Dataset` without the columns forward does not take."""
    if not trainer.args.remove_unused_columns:
        return dataset
    trainer._set_signature_columns_if_needed()
    return columns.remove_unused_columns(dataset, trainer._signature_columns, description, type(trainer.model).__name__)


def collator_with_removed_columns(trainer, data_collator, description: str | None = None):
    """transformers' Trainer._get_collator_with_removed_columns: the collator dropping keys forward does not take."""
    if not trainer.args.remove_unused_columns:
        return data_collator
    trainer._set_signature_columns_if_needed()
    return columns.RemoveColumnsCollator(
        data_collator, trainer._signature_columns, description, type(trainer.model).__name__
    )


def get_train_dataloader(trainer):
    if trainer.train_dataset is None:
        raise ValueError("Trainer.train() needs a train_dataset.")
    return build_dataloader(trainer, trainer.train_dataset, "training", trainer._train_batch_size, train=True)


def get_eval_dataloader(trainer, eval_dataset=None):
    """With dataloader_persistent_workers, one loader per eval dataset name ("eval" when unnamed) is
    kept and reused, as transformers does: its workers stay up, and iterating it again draws no new
    base seed from the global RNG (only the first evaluation does), which the training RNG relies on.
    Unlike transformers, a different dataset under the same name gets a loader of its own."""
    key = eval_dataset if isinstance(eval_dataset, str) else "eval"
    if isinstance(eval_dataset, str):
        eval_dataset = trainer.eval_dataset[eval_dataset]
    eval_dataset = eval_dataset if eval_dataset is not None else trainer.eval_dataset
    if eval_dataset is None:
        raise ValueError("Evaluation needs an eval_dataset (pass it to Trainer or to evaluate()).")
    persistent = trainer.args.dataloader_persistent_workers and trainer.args.dataloader_num_workers > 0
    cache = trainer.__dict__.setdefault("_eval_dataloaders", {})
    if persistent and key in cache and cache[key][0] is eval_dataset:
        return cache[key][1]
    loader = build_dataloader(trainer, eval_dataset, "evaluation", trainer.args.eval_batch_size, train=False)
    if persistent:
        cache[key] = (eval_dataset, loader)
    return loader


def get_test_dataloader(trainer, test_dataset):
    return build_dataloader(trainer, test_dataset, "test", trainer.args.eval_batch_size, train=False)


def num_examples(trainer, dataloader) -> int:
    dataset = getattr(dataloader, "dataset", None)
    try:
        return len(dataset)
    except TypeError:
        return len(dataloader) * trainer.args.per_device_train_batch_size
