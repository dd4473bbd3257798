"""The repeated-prompt sampler of GRPO: each generation batch holds `batch_size` distinct prompts, each
repeated `mini_repeat_count` (num_generations) times, and the whole batch is yielded `repeat_count` times
(num_iterations x steps_per_generation) so that the buffered completions line up with the steps that use them.
The order is TRL's RepeatSampler's: one torch.randperm per pass from a generator seeded once with `seed`."""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class RepeatedPromptSampler(Sampler):
    def __init__(
        self,
        num_samples: int,
        mini_repeat_count: int,
        batch_size: int = 1,
        repeat_count: int = 1,
        shuffle: bool = True,
        seed: int | None = None,
    ):
        self.num_samples = num_samples
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.shuffle = shuffle
        self.seed, self.epoch = seed, None
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        """The Trainer's loop names each epoch: its order is then the (epoch+1)-th permutation drawn from the
        seed, the one an uninterrupted run draws, also in a run resumed in a later epoch."""
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle and self.seed is not None and self.epoch is not None:
            self.generator.manual_seed(self.seed)
            for _ in range(self.epoch):
                torch.randperm(self.num_samples, generator=self.generator)
        order = (
            torch.randperm(self.num_samples, generator=self.generator).tolist()
            if self.shuffle
            else list(range(self.num_samples))
        )
        # Only whole groups of batch_size prompts: the tail that does not fill one is dropped.
        for start in range(0, self.num_samples - self.batch_size + 1, self.batch_size):
            chunk = order[start : start + self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    yield from [index] * self.mini_repeat_count

    def __len__(self) -> int:
        return (self.num_samples // self.batch_size) * self.batch_size * self.mini_repeat_count * self.repeat_count

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
