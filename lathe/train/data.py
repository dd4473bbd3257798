"""Dataloaders for the Trainer: seeded samplers, length grouping, resumable batching, column pruning."""
from __future__ import annotations

import inspect
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

logger = logging.getLogger(__name__)


# ---- samplers: the order of an epoch is a pure function of (seed, epoch) ----


class EpochSampler(Sampler[int]):
    """Every index once per epoch, shuffled by `torch.randperm` seeded with `seed + epoch`.

    This is the permutation transformers.Trainer draws too: accelerate swaps its RandomSampler for
    a SeedableRandomSampler (use_seedable_sampler=True, the default) that reseeds a private
    generator with `data_seed or seed` plus the epoch. Same seed, same sample order. A fresh
    generator per epoch keeps the global RNG (dropout, init) untouched and makes resume exact:
    no sampler state needs saving, only the epoch number. Unlike accelerate's sampler it does not
    advance the epoch by itself after a pass; the Trainer calls set_epoch at every epoch start.
    """

    def __init__(self, num_samples: int, seed: int = 0, shuffle: bool = True):
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(range(self.num_samples))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.num_samples, generator=generator).tolist())

    def __len__(self) -> int:
        return self.num_samples


def get_length_grouped_indices(
    lengths, batch_size: int, mega_batch_mult: int | None = None, generator: torch.Generator | None = None
) -> list[int]:
    """HF's length grouping: a random permutation cut into megabatches of `mega_batch_mult * batch_size`,
    each sorted by length (longest first), with the longest sample of all moved to position 0 so
    that an out-of-memory error shows on the first step rather than hours in.

    Gives the same list as transformers' function for the same generator, ties included, but sorts
    all megabatches in one batched torch sort instead of a Python sort each (a few times faster).
    """
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    total = len(lengths)
    if total == 0:
        return []
    if mega_batch_mult is None:
        # 50 batches per megabatch, or fewer so a small dataset still gets about 4 megabatches.
        mega_batch_mult = max(min(total // (batch_size * 4), 50), 1)
    megabatch_size = mega_batch_mult * batch_size
    permutation = torch.randperm(total, generator=generator)
    permuted_lengths = lengths[permutation]
    # Stable descending sorts keep equal lengths in permuted order, like HF's sorted(reverse=True).
    full = total - total % megabatch_size
    positions = []
    if full:
        rows = torch.sort(permuted_lengths[:full].view(-1, megabatch_size), dim=1, descending=True, stable=True)
        positions.append((rows.indices + torch.arange(0, full, megabatch_size).unsqueeze(1)).flatten())
    if full < total:  # the last, shorter megabatch
        positions.append(torch.sort(permuted_lengths[full:], descending=True, stable=True).indices + full)
    grouped = permutation[torch.cat(positions)]
    # Each megabatch now starts with its own longest sample; argmax picks the first on ties, as HF.
    starts = torch.arange(0, total, megabatch_size)
    winner = int(starts[torch.argmax(lengths[grouped[starts]])])
    grouped[0], grouped[winner] = grouped[winner].clone(), grouped[0].clone()
    return grouped.tolist()


class LengthGroupedSampler(Sampler[int]):
    """Batches of similar length with some randomness (HF semantics), the order seeded by
    `seed + epoch`. HF's train sampler draws from the global RNG instead, so its order depends on
    everything that consumed random numbers before it; ours depends only on (seed, epoch), which
    exact resume needs. HF's eval sampler seeds a fresh generator with the seed: same as epoch 0 here.
    """

    def __init__(
        self, lengths: Sequence[int] | torch.Tensor, batch_size: int, seed: int = 0, mega_batch_mult: int | None = None
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.lengths = torch.as_tensor(lengths, dtype=torch.int64)
        self.batch_size = batch_size
        self.seed = seed
        self.mega_batch_mult = mega_batch_mult
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, self.mega_batch_mult, generator))

    def __len__(self) -> int:
        return len(self.lengths)


def dataset_lengths(dataset, length_column_name: str = "length", model_input_name: str = "input_ids") -> list[int]:
    """Sample lengths for length grouping: a precomputed column when the dataset has one, else
    `len(item[model_input_name])` for every item (which reads the whole dataset, hence the warning)."""
    if is_datasets_dataset(dataset) and length_column_name in dataset.column_names:
        column = dataset[length_column_name]
        return column.tolist() if isinstance(column, torch.Tensor) else [int(length) for length in column]
    if len(dataset) == 0:
        return []
    first = dataset[0]
    if not isinstance(first, Mapping) or model_input_name not in first:
        raise ValueError(
            f"group_by_length needs sample lengths: give the dataset a {length_column_name!r} column, or make "
            f"its items dicts with a {model_input_name!r} key (item 0 is a {type(first).__name__}"
            + (f" with keys {list(first)}" if isinstance(first, Mapping) else "") + ")."
        )
    logger.warning(
        "group_by_length: computing the length of each of the %d samples from %r reads the whole dataset "
        "once. Add a %r column to the dataset to skip this.",
        len(dataset), model_input_name, length_column_name,
    )
    if is_datasets_dataset(dataset) and model_input_name in dataset.column_names:
        # One column read instead of decoding every full row.
        return [len(value) for value in dataset[model_input_name]]
    return [len(dataset[index][model_input_name]) for index in range(len(dataset))]


# ---- batching that can resume mid-epoch without loading the skipped data ----


class ResumableBatchSampler(BatchSampler):
    """A BatchSampler that can start an epoch at batch n, skipping by index arithmetic alone, so the
    skipped samples are never fetched or collated. `len()` is always the full epoch (step planning
    counts the skipped batches too)."""

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool = False):
        super().__init__(sampler, batch_size, drop_last)
        self._batches_to_skip = 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def skip_batches(self, num_batches: int) -> None:
        """Make the next iteration (only) start at batch `num_batches` of the epoch."""
        if num_batches < 0:
            raise ValueError(f"num_batches must be >= 0, got {num_batches}")
        self._batches_to_skip = num_batches

    def __iter__(self) -> Iterator[list[int]]:
        # The skip is read and reset when the first batch is drawn, not when iter() is called:
        # with workers, DataLoader calls iter() twice at the start of a pass and discards the
        # first iterator unused. Reset on first draw, an interrupted pass does not re-skip.
        skip, self._batches_to_skip = self._batches_to_skip, 0
        indices = list(self.sampler)
        end = len(indices) - len(indices) % self.batch_size if self.drop_last else len(indices)
        for start in range(skip * self.batch_size, end, self.batch_size):
            yield indices[start : start + self.batch_size]


def build_dataloader(
    dataset,
    *,
    batch_size: int,
    collate_fn: Callable | None = None,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    num_workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    group_by_length: bool = False,
    lengths: Sequence[int] | None = None,
    length_column_name: str = "length",
    model_input_name: str = "input_ids",
    length_group_size: int | None = None,
    worker_init_fn: Callable | None = None,
    multiprocessing_context=None,
    generator: torch.Generator | None = None,
) -> DataLoader:
    """The Trainer's DataLoader. Map-style datasets get a ResumableBatchSampler over an EpochSampler
    (or a LengthGroupedSampler when `group_by_length`, which takes precedence over `shuffle` as in
    HF); iterable datasets get a plain batched DataLoader in their own order (`shuffle` is theirs).

    The dataset is passed through unwrapped, so DataLoader's `__getitems__` fast path still applies.
    `length_group_size` is the batch size length grouping works in: HF uses the per-device batch
    size times gradient_accumulation_steps so all micro-batches of one update have similar lengths.
    `generator` only seeds the workers' base seed; without it DataLoader draws that seed from the
    global RNG once per iter(), exactly as under HF, which keeps the two RNG streams in step.
    Do not use `in_order=False`: out-of-order batches would make resume inexact.
    """
    options: dict[str, Any] = {
        "collate_fn": collate_fn,
        "num_workers": num_workers,
        # torch warns on every epoch when asked to pin without an accelerator; pinning is moot then.
        "pin_memory": pin_memory and _has_accelerator(),
        "worker_init_fn": worker_init_fn,
        "generator": generator,
    }
    if num_workers > 0:
        # torch rejects these three with num_workers=0.
        options.update(persistent_workers=persistent_workers, prefetch_factor=prefetch_factor)
        options["multiprocessing_context"] = multiprocessing_context
    if isinstance(dataset, IterableDataset):
        return DataLoader(dataset, batch_size=batch_size, drop_last=drop_last, **options)
    if group_by_length:
        if lengths is None:
            lengths = dataset_lengths(dataset, length_column_name, model_input_name)
        if len(lengths) != len(dataset):
            raise ValueError(f"lengths has {len(lengths)} entries but the dataset has {len(dataset)} items.")
        sampler: Sampler[int] = LengthGroupedSampler(lengths, length_group_size or batch_size, seed)
    else:
        sampler = EpochSampler(len(dataset), seed, shuffle)
    return DataLoader(dataset, batch_sampler=ResumableBatchSampler(sampler, batch_size, drop_last), **options)


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6; older ones only pin for CUDA
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def set_epoch(dataloader, epoch: int) -> None:
    """Tell a dataloader's sampler (or an iterable dataset) which epoch starts, so its order is that
    epoch's. Works on build_dataloader's result and on user dataloaders with a DistributedSampler,
    or a `datasets.IterableDataset` (whose shuffle buffer is seeded by epoch). With persistent
    workers an iterable dataset's copies in the workers do not see this: a torch limitation."""
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    sampler = getattr(dataloader, "sampler", None)
    if hasattr(batch_sampler, "set_epoch"):
        batch_sampler.set_epoch(epoch)
    elif hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    dataset = getattr(dataloader, "dataset", None)
    if isinstance(dataset, IterableDataset) and hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)


def skip_batches(dataloader, num_batches: int) -> Iterable:
    """Return what to iterate for an epoch that resumes after `num_batches` batches.

    For build_dataloader's map-style loaders that is the dataloader itself, armed to skip at the
    sampler: nothing skipped is fetched. An iterable dataset cannot seek, and neither can a
    dataloader we did not build, so there the skipped batches are loaded, collated and discarded
    before this returns (a one-shot iterator, already past them). Either way, take len() from the
    dataloader, not the result.
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}")
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    if isinstance(batch_sampler, ResumableBatchSampler):
        batch_sampler.skip_batches(num_batches)
        return dataloader
    if num_batches == 0:
        return dataloader
    # Read them now, not lazily on the first next(): creating the iterator and collating may draw
    # from the global RNG, and the Trainer restores a checkpoint's RNG state right after this call.
    iterator = iter(dataloader)
    for _ in itertools.islice(iterator, num_batches):
        pass
    return iterator


# ---- which columns reach model.forward ----


def is_datasets_dataset(dataset) -> bool:
    """A map-style `datasets.Dataset`, recognised by duck typing so `datasets` is never imported.
    DatasetDict (column_names is a dict) and IterableDataset (no len) are excluded, as in HF."""
    return (
        isinstance(getattr(dataset, "column_names", None), list)
        and hasattr(dataset, "remove_columns")
        and hasattr(dataset, "__len__")
    )


def signature_columns(model, label_names: Sequence[str] | None = None) -> list[str]:
    """The columns model.forward can take: its parameter names, plus "label", "label_ids" (the
    default collator renames those to "labels") and the Trainer's label_names."""
    if hasattr(model, "peft_config"):
        # A PEFT wrapper's forward is (*args, **kwargs); the base model's signature is the real one.
        model = model.get_base_model() if hasattr(model, "get_base_model") else model.base_model.model
    parameters = list(inspect.signature(model.forward).parameters)
    return list(dict.fromkeys(parameters + ["label", "label_ids"] + list(label_names or [])))


def _ignored_columns_message(ignored: list[str], description: str | None, model_name: str) -> str:
    where = f" in the {description} set" if description else ""
    names = ", ".join(ignored)
    return (
        f"The following columns{where} don't have a corresponding argument in `{model_name}.forward` and have "
        f"been ignored: {names}. If {names} are not expected by `{model_name}.forward`, you can safely ignore "
        "this message."
    )


def remove_unused_columns(
    dataset, columns: Sequence[str], description: str | None = None, model_name: str = "model"
):
    """Drop the columns of a `datasets.Dataset` that model.forward does not take (HF semantics)."""
    keep = set(columns)
    ignored = [name for name in dataset.column_names if name not in keep]
    if len(ignored) == len(dataset.column_names):
        where = f"the {description} dataset" if description else "the dataset"
        raise ValueError(
            f"No column of {where} matches an argument of `{model_name}.forward`, so nothing would be left to "
            f"train on. Dataset columns: {list(dataset.column_names)}. Arguments `{model_name}.forward` accepts "
            f"(plus label names): {list(columns)}. Rename the columns to match, or set "
            "`remove_unused_columns=False` in TrainingArguments to keep them all."
        )
    if not ignored:
        return dataset
    logger.info(_ignored_columns_message(ignored, description, model_name))
    return dataset.remove_columns(ignored)


class RemoveColumnsCollator:
    """Wraps a collator to drop the keys model.forward does not take, for datasets that are not a
    `datasets.Dataset`. Only plain dicts are filtered (HF semantics): tuples, lists and
    UserDict-based items such as BatchEncoding pass through unchanged."""

    def __init__(
        self,
        data_collator: Callable,
        signature_columns: Sequence[str],
        description: str | None = None,
        model_name: str | None = None,
    ):
        self.data_collator = data_collator
        self.signature_columns = list(signature_columns)
        self.description = description
        self.model_name = model_name
        self._keep = frozenset(signature_columns)
        self._message_logged = False

    def _remove_columns(self, feature):
        if not isinstance(feature, dict) or feature.keys() <= self._keep:
            return feature  # nothing to drop: skip rebuilding the dict
        if not self._message_logged and self.model_name:
            ignored = [key for key in feature if key not in self._keep]
            logger.info(_ignored_columns_message(ignored, self.description, self.model_name))
            self._message_logged = True
        return {key: value for key, value in feature.items() if key in self._keep}

    def __call__(self, features: list):
        return self.data_collator([self._remove_columns(feature) for feature in features])


def prune_unused_columns(
    dataset, collate_fn: Callable, columns: Sequence[str], description: str | None = None, model_name: str = "model"
):
    """HF's split: a `datasets.Dataset` loses its unused columns once; any other dataset keeps its
    items and the collator drops unused keys per batch. Returns (dataset, collate_fn)."""
    if is_datasets_dataset(dataset):
        return remove_unused_columns(dataset, columns, description, model_name), collate_fn
    return dataset, RemoveColumnsCollator(collate_fn, columns, description, model_name)


# ---- item checks ----


def validate_item(item, index: int = 0) -> None:
    """Fail early and clearly when items are neither dicts nor tuples/lists, instead of deep inside
    a collator or model(**inputs). Call it only with the default collators: a custom collator may
    take any item type (raw strings tokenised in the collator are fine under HF)."""
    if isinstance(item, (Mapping, tuple, list)):
        return
    raise TypeError(
        f"Dataset item {index} is a {type(item).__name__}, but the Trainer's collators expect each item to be a "
        "dict mapping input names to values (e.g. {'input_ids': [...], 'labels': [...]}) or a tuple/list. "
        "Return one of those from the dataset, or pass a data_collator that handles this type."
    )


def validate_first_item(dataset) -> None:
    """validate_item on item 0 of a map-style dataset; an iterable one is not peeked at (that would
    start its stream) and an empty one has nothing to check."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or len(dataset) == 0:
        return
    validate_item(dataset[0], 0)
