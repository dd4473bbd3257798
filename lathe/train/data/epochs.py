"""An epoch's batches: the sampler told which epoch starts, the batches a resumed run already trained on
skipped, and the rest read one batch ahead as transformers' (accelerate's) loader reads them."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from torch.utils.data import IterableDataset

from lathe.train.data.sampling import ResumableBatchSampler
from lathe.train.seed import restore_rng_state


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
    inner = getattr(batch_sampler, "sampler", None)
    if type(inner).__name__ == "SeedableRandomSampler":  # Trainer.accelerator.prepare's, as accelerate sets it
        inner.set_epoch(epoch)
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


def epoch_batches(dataloader, epoch: int, batches_to_skip: int, rng_state: dict | None) -> Iterator:
    """The epoch's batch iterator, past the `batches_to_skip` a resumed run already trained on (skipped
    at the sampler, or read and dropped where the loader cannot seek), read one batch ahead (prefetched).

    `rng_state` (the checkpoint's, on a resumed epoch that skips nothing) is restored first, as
    transformers does before it creates the epoch's iterator. A resumed epoch that skips batches
    restores it after its first update's batches instead: the Trainer's loop does that (see
    training_loop), again where transformers does."""
    set_epoch(dataloader, epoch)
    if rng_state is not None and batches_to_skip == 0:
        restore_rng_state(rng_state)
    return read_ahead(dataloader, batches_to_skip)


def read_ahead(dataloader, batches_to_skip: int = 0) -> Iterator:
    """Batches in order, each one collated before the previous one is handed out: accelerate's
    DataLoaderShard reads one batch ahead to know the end of the loader, and transformers' Trainer
    trains through it, so its collator runs collate, collate, step, collate, step, ... A collator
    that draws random numbers (MLM masking) then sees the RNG state transformers' collator sees,
    between the dropout draws of the steps. Nothing runs before the first next(): creating the
    loader's iterator (which draws its workers' base seed) and skipping happen there, as in accelerate."""
    iterator = iter(skip_batches(dataloader, batches_to_skip))
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current
        current = following
    yield current
