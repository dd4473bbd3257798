"""Dataloaders for the Trainer: seeded samplers, length grouping, resumable batching, lean single-process
loading. Which columns reach the model is lathe.train.data.columns."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from lathe.train.data.columns import is_datasets_dataset

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
    """Batches of similar length with some randomness (HF semantics). With a `seed`, the order is
    seeded by `seed + epoch` (transformers' eval sampler: a fresh generator seeded with the seed, the
    same as epoch 0 here). With `seed=None` it draws from the global RNG when an epoch's iteration
    starts, as transformers' train sampler does, so its order depends on everything that consumed
    random numbers before it (as under transformers); a run resumed mid-epoch then reorders the rest
    of that epoch, as transformers' does.
    """

    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        batch_size: int,
        seed: int | None = 0,
        mega_batch_mult: int | None = None,
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
        generator = None if self.seed is None else torch.Generator().manual_seed(self.seed + self.epoch)
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
            + (f" with keys {list(first)}" if isinstance(first, Mapping) else "")
            + ")."
        )
    logger.warning(
        "group_by_length: computing the length of each of the %d samples from %r reads the whole dataset "
        "once. Add a %r column to the dataset to skip this.",
        len(dataset),
        model_input_name,
        length_column_name,
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

    def __init__(
        self, sampler: Sampler[int], batch_size: int, drop_last: bool = False, num_shards: int = 1, shard_index: int = 0
    ):
        super().__init__(sampler, batch_size, drop_last)
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index must be in [0, {num_shards}), got {shard_index}")
        self._batches_to_skip = 0
        # Under N processes, shard r takes batches r, r + N, r + 2N, ... of the epoch's batches (as
        # accelerate's BatchSamplerShard), the list first completed from its start so every shard
        # has as many batches (even_batches): one update of N shards sees what one process with N
        # times the batch size would.
        self.num_shards, self.shard_index = num_shards, shard_index

    def __len__(self) -> int:
        total = super().__len__()
        if self.num_shards == 1:
            return total
        # accelerate: whole rounds with drop_last, else the incomplete round completed
        return total // self.num_shards if self.drop_last else -(-total // self.num_shards)

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
        if self.num_shards > 1:
            yield from self._shard(
                [indices[start : start + self.batch_size] for start in range(0, end, self.batch_size)]
            )[skip:]
            return
        for start in range(skip * self.batch_size, end, self.batch_size):
            yield indices[start : start + self.batch_size]

    def _shard(self, batches: list[list[int]]) -> list[list[int]]:
        """This shard's batches, as accelerate's BatchSamplerShard (even_batches, no split) yields them: whole
        rounds of N batches; without drop_last a short last batch is completed from the epoch's first samples,
        and more batches made of those samples follow until every shard has as many (so the last step's
        duplicates are the first samples, which gather_for_metrics then trims)."""
        count, index, size = self.num_shards, self.shard_index, self.batch_size
        rounds = len(batches) // count
        if not self.drop_last and len(batches[-1]) < size and len(batches) % count == 0:
            rounds -= 1  # a round ends with a full batch, else it is the incomplete one
        mine = batches[index : rounds * count : count]
        tail = [list(batch) for batch in batches[rounds * count :]]
        if self.drop_last or not tail:  # with drop_last an incomplete round is dropped
            return mine
        initial = [sample for batch in batches[:count] for sample in batch]
        while len(initial) < count * size:
            initial += initial
        cursor = 0
        if len(tail[-1]) < size:
            cursor = size - len(tail[-1])
            tail[-1] += initial[:cursor]
        while len(tail) < count:
            tail.append(initial[cursor : cursor + size])
            cursor += size
        return mine + [tail[index]]


class DirectDataLoader(DataLoader):
    """A DataLoader whose single-process iteration is the bare loop: next batch of indices, fetch
    (`__getitems__` when the dataset has it, else item by item), collate. torch's iterator adds a
    profiler scope and bookkeeping to every batch, ~60 µs here: a third of the Trainer's overhead
    over a hand-written loop on a small model. Workers, pinning and timeouts keep torch's iterator.
    """

    def __iter__(self):
        if self.num_workers > 0 or self.pin_memory or self.timeout or self.batch_sampler is None:
            return super().__iter__()
        batches = iter(self.batch_sampler)
        # torch's iterator draws its workers' base seed from the global RNG when it is created;
        # drawing it here too keeps the global RNG (dropout, augmentations) in step with
        # transformers.Trainer, which exact-resume and cross-library tests rely on.
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        return self._collated(batches)

    def _collated(self, batches: Iterator[list[int]]) -> Iterator:
        dataset, collate = self.dataset, self.collate_fn
        fetch_many = getattr(dataset, "__getitems__", None)
        for indices in batches:
            yield collate(fetch_many(indices) if fetch_many else [dataset[index] for index in indices])


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
    in_order: bool = True,
    generator: torch.Generator | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
) -> DataLoader:
    """The Trainer's DataLoader. Map-style datasets get a ResumableBatchSampler over an EpochSampler
    (or a LengthGroupedSampler when `group_by_length`, which takes precedence over `shuffle` as in
    HF); iterable datasets get a plain batched DataLoader in their own order (`shuffle` is theirs).

    The dataset is passed through unwrapped (DataLoader's `__getitems__` fast path). Length grouping works in
    `length_group_size` (HF: batch size x accumulation, so one update's micro-batches have similar lengths).
    `generator` only seeds the workers' base seed; without it DataLoader draws that seed from the global RNG
    once per iter(), as under HF (the RNG streams stay in step). in_order=False: resume is not exact.
    """
    options = _loader_options(
        collate_fn,
        num_workers,
        pin_memory,
        worker_init_fn,
        generator,
        persistent_workers,
        prefetch_factor,
        multiprocessing_context,
        in_order,
    )
    if isinstance(dataset, IterableDataset):
        if num_shards > 1:
            raise NotImplementedError(
                "An IterableDataset under several processes is not supported yet: every rank would read the same "
                "stream. Use a map-style dataset (with __len__ and __getitem__), or run one process."
            )
        return DataLoader(dataset, batch_size=batch_size, drop_last=drop_last, **options)
    if group_by_length:
        lengths = lengths if lengths is not None else dataset_lengths(dataset, length_column_name, model_input_name)
        sampler = _length_grouped_sampler(dataset, lengths, length_group_size or batch_size, seed, shuffle)
    else:
        sampler = EpochSampler(len(dataset), seed, shuffle)
    batch_sampler = ResumableBatchSampler(
        sampler, batch_size, drop_last, num_shards=num_shards, shard_index=shard_index
    )
    return DirectDataLoader(dataset, batch_sampler=batch_sampler, **options)


def _length_grouped_sampler(dataset, lengths: Sequence[int], group_size: int, seed: int, shuffle: bool) -> Sampler[int]:
    if len(lengths) != len(dataset):
        raise ValueError(f"lengths has {len(lengths)} entries but the dataset has {len(dataset)} items.")
    # transformers' train sampler draws its order from the global RNG, its eval sampler from the seed.
    return LengthGroupedSampler(lengths, group_size, None if shuffle else seed)


def _loader_options(
    collate_fn,
    num_workers: int,
    pin_memory: bool,
    worker_init_fn,
    generator,
    persistent_workers: bool,
    prefetch_factor: int | None,
    multiprocessing_context,
    in_order: bool = True,
) -> dict[str, Any]:
    options: dict[str, Any] = {
        "collate_fn": collate_fn,
        "num_workers": num_workers,
        # torch warns on every epoch when asked to pin without an accelerator; pinning is moot then.
        "pin_memory": pin_memory and _has_accelerator(),
        "worker_init_fn": worker_init_fn,
        "generator": generator,
    }
    if num_workers > 0:
        # torch rejects these with num_workers=0.
        options.update(persistent_workers=persistent_workers, prefetch_factor=prefetch_factor, in_order=in_order)
        options["multiprocessing_context"] = multiprocessing_context
    return options


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6; older ones only pin for CUDA
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
