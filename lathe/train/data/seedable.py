"""accelerate's SeedableRandomSampler, which transformers' Trainer puts in place of a torch RandomSampler in any
dataloader its accelerator prepares (use_seedable_sampler, the default): each pass reseeds the sampler's generator
with initial seed + epoch. Trainer.accelerator.prepare does the same to a library's own dataloader
(sentence-transformers builds one), so its epochs come in transformers' order."""

from __future__ import annotations

import torch
from torch.utils.data import BatchSampler, RandomSampler


class SeedableRandomSampler(RandomSampler):
    """A RandomSampler whose pass `epoch` draws from a generator seeded with initial_seed + epoch."""

    def __init__(self, *args, data_seed: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self):
        if self.generator is None:
            self.generator = torch.Generator()
            self.generator.manual_seed(self.initial_seed)
        self.generator.manual_seed(self.epoch + self.initial_seed)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def make_sampler_seedable(dataloader, data_seed: int | None) -> None:
    """Replace the loader's torch RandomSampler (inside its batch sampler) by a SeedableRandomSampler, in place,
    as accelerate's prepare_data_loader does."""
    holder = dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler
    sampler = getattr(holder, "sampler", None)
    if not isinstance(sampler, RandomSampler) or isinstance(sampler, SeedableRandomSampler):
        return
    holder.sampler = SeedableRandomSampler(
        data_source=sampler.data_source,
        replacement=sampler.replacement,
        num_samples=sampler._num_samples,
        generator=getattr(sampler, "generator", None) or torch.Generator(),
        data_seed=data_seed,
    )
