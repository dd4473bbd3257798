"""Samplers, resumable batching, length grouping, column pruning and item checks of lathe.train.data.sampling."""

import logging
import subprocess
import sys

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from lathe.train.data.columns import (
    RemoveColumnsCollator,
    prune_unused_columns,
    remove_unused_columns,
    signature_columns,
    validate_first_item,
    validate_item,
)
from lathe.train.data.epochs import set_epoch, skip_batches
from lathe.train.data.sampling import (
    DirectDataLoader,
    EpochSampler,
    LengthGroupedSampler,
    ResumableBatchSampler,
    build_dataloader,
    dataset_lengths,
    get_length_grouped_indices,
)


class CountingDataset(Dataset):
    """Item i is {"index": i}; remembers every index fetched."""

    def __init__(self, size):
        self.size = size
        self.fetched = []

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        self.fetched.append(index)
        return {"index": index}


class BatchFetchDataset(CountingDataset):
    def __init__(self, size):
        super().__init__(size)
        self.batch_calls = 0

    def __getitems__(self, indices):
        self.batch_calls += 1
        self.fetched.extend(indices)
        return [{"index": index} for index in indices]


def epoch_order(seed, epoch, size=20):
    sampler = EpochSampler(size, seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def batches_of(loader):
    return [batch["index"].tolist() for batch in loader]


# ---- EpochSampler ----


def test_epoch_sampler_is_a_seeded_permutation_per_epoch():
    order = epoch_order(seed=7, epoch=0)
    assert sorted(order) == list(range(20))
    assert order == epoch_order(seed=7, epoch=0)
    assert order != epoch_order(seed=7, epoch=1)
    assert order != epoch_order(seed=8, epoch=0)
    # The documented recipe: randperm from a generator seeded with seed + epoch.
    expected = torch.randperm(20, generator=torch.Generator().manual_seed(7 + 3)).tolist()
    assert epoch_order(seed=7, epoch=3) == expected


def test_epoch_sampler_ignores_and_preserves_global_rng():
    torch.manual_seed(1)
    first = epoch_order(seed=5, epoch=2)
    torch.manual_seed(999)
    state = torch.get_rng_state()
    second = epoch_order(seed=5, epoch=2)
    assert first == second
    assert torch.equal(torch.get_rng_state(), state)


def test_epoch_sampler_without_shuffle_is_sequential():
    sampler = EpochSampler(5, seed=3, shuffle=False)
    sampler.set_epoch(4)
    assert list(sampler) == [0, 1, 2, 3, 4]
    assert len(sampler) == 5


@pytest.mark.hf
def test_train_order_matches_transformers_trainer(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(1, 1)

        def forward(self, index, labels=None):
            return {"loss": self.linear(index.float()).sum()}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, seed=123, use_cpu=True, report_to="none"
    )
    trainer = transformers.Trainer(model=Model(), args=args, train_dataset=CountingDataset(37))
    hf_loader = trainer.get_train_dataloader()
    ours = build_dataloader(CountingDataset(37), batch_size=4, shuffle=True, seed=123)
    for epoch in range(2):
        hf_loader.set_epoch(epoch)
        set_epoch(ours, epoch)
        assert batches_of(ours) == batches_of(hf_loader)


# ---- ResumableBatchSampler and build_dataloader ----


def test_dataloader_order_depends_only_on_seed_and_epoch():
    torch.manual_seed(0)
    loader = build_dataloader(CountingDataset(10), batch_size=3, shuffle=True, seed=11)
    set_epoch(loader, 1)
    epoch_one = batches_of(loader)
    torch.manual_seed(12345)
    rebuilt = build_dataloader(CountingDataset(10), batch_size=3, shuffle=True, seed=11)
    set_epoch(rebuilt, 1)
    assert batches_of(rebuilt) == epoch_one
    set_epoch(rebuilt, 2)
    assert batches_of(rebuilt) != epoch_one
    assert [len(batch) for batch in epoch_one] == [3, 3, 3, 1]


def test_a_pass_draws_from_the_global_rng_only_without_a_generator():
    # DataLoader draws its worker base seed per pass: from the global RNG by default (as under HF).
    torch.manual_seed(0)
    expected_after_one_draw = torch.empty((), dtype=torch.int64).random_().item()
    torch.manual_seed(0)
    batches_of(build_dataloader(CountingDataset(4), batch_size=2, shuffle=True, seed=1))
    assert torch.empty((), dtype=torch.int64).random_().item() != expected_after_one_draw
    torch.manual_seed(0)
    batches_of(build_dataloader(CountingDataset(4), batch_size=2, shuffle=True, seed=1, generator=torch.Generator()))
    assert torch.empty((), dtype=torch.int64).random_().item() == expected_after_one_draw


@pytest.mark.parametrize("skip", [0, 1, 3, 4, 9])
def test_skip_batches_yields_the_rest_without_fetching_skipped_items(skip):
    full = batches_of(build_dataloader(CountingDataset(10), batch_size=3, shuffle=True, seed=2))
    dataset = CountingDataset(10)
    loader = build_dataloader(dataset, batch_size=3, shuffle=True, seed=2)
    resumed = batches_of(skip_batches(loader, skip))
    assert resumed == full[skip:]
    skipped_items = {index for batch in full[:skip] for index in batch}
    assert sorted(dataset.fetched) == sorted(index for batch in full[skip:] for index in batch)
    assert not skipped_items & set(dataset.fetched)
    # The skip applies to one pass only; len() always reports the full epoch.
    assert batches_of(loader) == full
    assert len(loader) == 4


def test_skip_is_consumed_even_when_the_pass_is_interrupted():
    loader = build_dataloader(CountingDataset(10), batch_size=2, seed=0)
    iterator = iter(skip_batches(loader, 2))
    assert next(iterator)["index"].tolist() == [4, 5]
    del iterator
    assert batches_of(loader)[0] == [0, 1]


def test_drop_last():
    loader = build_dataloader(CountingDataset(10), batch_size=3, drop_last=True)
    assert batches_of(loader) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert len(loader) == 3
    assert batches_of(skip_batches(loader, 2)) == [[6, 7, 8]]
    keep_last = build_dataloader(CountingDataset(10), batch_size=3, drop_last=False)
    assert batches_of(keep_last)[-1] == [9]
    assert len(keep_last) == 4


def test_resumable_batch_sampler_forwards_epoch_and_rejects_negative_skip():
    sampler = ResumableBatchSampler(EpochSampler(6, seed=1), batch_size=4)
    sampler.set_epoch(5)
    assert sampler.sampler.epoch == 5
    assert len(sampler) == 2
    with pytest.raises(ValueError):
        sampler.skip_batches(-1)


def test_getitems_is_used_once_per_batch_and_dataset_is_not_wrapped():
    dataset = BatchFetchDataset(10)
    loader = build_dataloader(dataset, batch_size=4, seed=0)
    assert loader.dataset is dataset
    batches_of(skip_batches(loader, 1))
    assert dataset.batch_calls == 2
    assert sorted(dataset.fetched) == list(range(4, 10))


def test_direct_loader_matches_torch_dataloader_batches_and_global_rng():
    """The lean single-process iteration is torch's, minus bookkeeping: same batches (a collator that
    draws random numbers included), the same global-RNG draw made when iter() is called (the
    Trainer restores RNG state right after creating the iterator), and the same RNG state after."""

    def noisy_collate(items):
        return {"index": torch.tensor([item["index"] for item in items]), "noise": torch.rand(len(items))}

    def run(loader_class):
        torch.manual_seed(3)
        loader = loader_class(
            CountingDataset(11),
            collate_fn=noisy_collate,
            batch_sampler=ResumableBatchSampler(EpochSampler(11, seed=5), 4),
        )
        iterator = iter(loader)
        after_iter = torch.get_rng_state()
        batches = [(batch["index"].tolist(), batch["noise"].tolist()) for batch in iterator]
        return batches, after_iter, torch.get_rng_state()

    direct, torch_loader = run(DirectDataLoader), run(torch.utils.data.DataLoader)
    assert direct[0] == torch_loader[0] and [len(indices) for indices, _ in direct[0]] == [4, 4, 3]
    assert torch.equal(direct[1], torch_loader[1]) and torch.equal(direct[2], torch_loader[2])
    assert isinstance(build_dataloader(CountingDataset(4), batch_size=2), DirectDataLoader)


def test_worker_only_options_are_dropped_without_workers():
    loader = build_dataloader(
        CountingDataset(4),
        batch_size=2,
        num_workers=0,
        persistent_workers=True,
        prefetch_factor=4,
        multiprocessing_context="spawn",
        pin_memory=True,
    )
    assert batches_of(loader) == [[0, 1], [2, 3]]


@pytest.mark.parametrize("persistent", [True, False])
def test_skip_and_epochs_with_a_worker(persistent):
    # With workers DataLoader calls iter() on the batch sampler twice per pass and drops the first.
    expected = batches_of(build_dataloader(CountingDataset(9), batch_size=2, shuffle=True, seed=4))
    loader = build_dataloader(
        CountingDataset(9),
        batch_size=2,
        shuffle=True,
        seed=4,
        num_workers=1,
        persistent_workers=persistent,
        prefetch_factor=2,
    )
    assert batches_of(skip_batches(loader, 2)) == expected[2:]
    assert batches_of(loader) == expected
    set_epoch(loader, 1)
    assert batches_of(skip_batches(loader, 1)) != expected[1:]


class Stream(IterableDataset):
    def __init__(self, size):
        self.size = size
        self.epoch = None

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter({"index": index} for index in range(self.size))


def test_iterable_dataset_gets_plain_batches_and_consumes_to_skip():
    stream = Stream(7)
    loader = build_dataloader(stream, batch_size=3, shuffle=True, seed=0)
    assert batches_of(loader) == [[0, 1, 2], [3, 4, 5], [6]]
    assert batches_of(skip_batches(loader, 2)) == [[6]]
    assert batches_of(skip_batches(loader, 5)) == []
    set_epoch(loader, 3)
    assert stream.epoch == 3
    dropped = build_dataloader(Stream(7), batch_size=3, drop_last=True)
    assert batches_of(dropped) == [[0, 1, 2], [3, 4, 5]]


# ---- length grouping ----


def test_length_grouping_puts_the_longest_first_and_groups_similar_lengths():
    lengths = torch.randint(1, 1000, (400,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = LengthGroupedSampler(lengths, batch_size=4, seed=3, mega_batch_mult=10)
    order = list(sampler)
    assert sorted(order) == list(range(400))
    assert lengths[order[0]] == max(lengths)
    # Each megabatch of 40 descends in length after its head (one head was swapped with the longest).
    for start in range(0, 400, 40):
        chunk = [lengths[index] for index in order[start + 1 : start + 40]]
        assert chunk == sorted(chunk, reverse=True)

    # Grouped batches spread far less in length than random batches of the same data.
    def mean_spread(indices):
        batches = [[lengths[i] for i in indices[k : k + 4]] for k in range(0, len(indices), 4)]
        return sum(max(b) - min(b) for b in batches) / len(batches)

    assert mean_spread(order) < mean_spread(list(range(400))) / 5
    sampler.set_epoch(1)
    assert list(sampler) != order
    assert list(LengthGroupedSampler(lengths, batch_size=4, seed=3, mega_batch_mult=10)) == order


@pytest.mark.hf
@pytest.mark.parametrize("size, batch_size, mult", [(400, 4, None), (37, 3, None), (1000, 8, 2), (5, 4, None)])
def test_length_grouping_matches_transformers(size, batch_size, mult):
    pytest.importorskip("transformers")
    from transformers.trainer_pt_utils import get_length_grouped_indices as hf_grouped

    # Few distinct lengths, so ties are everywhere and tie order has to match too.
    lengths = torch.randint(1, 6, (size,), generator=torch.Generator().manual_seed(size)).tolist()
    for seed in (0, 17):
        ours = get_length_grouped_indices(lengths, batch_size, mult, torch.Generator().manual_seed(seed))
        theirs = hf_grouped(lengths, batch_size, mult, torch.Generator().manual_seed(seed))
        assert ours == theirs


def test_group_by_length_dataloader_uses_length_group_size_and_lengths():
    lengths = [1, 9, 3, 7, 5, 2, 8, 4]
    loader = build_dataloader(
        CountingDataset(8), batch_size=2, group_by_length=True, lengths=lengths, seed=0, length_group_size=4
    )
    sampler = loader.batch_sampler.sampler
    assert isinstance(sampler, LengthGroupedSampler) and sampler.batch_size == 4
    assert batches_of(loader)[0][0] == 1  # index 1 has the longest length
    with pytest.raises(ValueError, match="lengths has 3 entries"):
        build_dataloader(CountingDataset(8), batch_size=2, group_by_length=True, lengths=[1, 2, 3])


def test_lengths_from_input_ids_warn_once(caplog):
    items = [{"input_ids": [0] * (i % 5 + 1)} for i in range(50)]
    with caplog.at_level(logging.WARNING, logger="lathe.train.data.sampling"):
        assert dataset_lengths(items) == [i % 5 + 1 for i in range(50)]
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "reads the whole dataset" in warnings[0].getMessage()
    with pytest.raises(ValueError, match="'length' column"):
        dataset_lengths([{"text": "a"}])


def test_lengths_from_a_datasets_column():
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [1]], "length": [30, 10]})
    assert dataset_lengths(data) == [30, 10]
    assert dataset_lengths(data.remove_columns("length")) == [3, 1]


# ---- column pruning ----


class TinyModel(torch.nn.Module):
    def forward(self, input_ids, attention_mask=None, labels=None):
        return input_ids


def test_signature_columns():
    columns = signature_columns(TinyModel(), label_names=["labels", "start_positions"])
    assert columns == ["input_ids", "attention_mask", "labels", "label", "label_ids", "start_positions"]


def test_remove_unused_columns_on_a_datasets_dataset(caplog):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"input_ids": [[1]], "text": ["a"], "label": [0], "idx": [5]})
    with caplog.at_level(logging.INFO, logger="lathe.train.data.columns"):
        pruned = remove_unused_columns(data, signature_columns(TinyModel()), "Training", "TinyModel")
    assert pruned.column_names == ["input_ids", "label"]
    assert "in the Training set" in caplog.text and "text, idx" in caplog.text
    assert "TinyModel.forward" in caplog.text
    pruned_again, collator = prune_unused_columns(data, None, signature_columns(TinyModel()))
    assert pruned_again.column_names == ["input_ids", "label"] and collator is None


def test_remove_unused_columns_error_names_columns_and_arguments():
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"text": ["a"], "idx": [5]})
    with pytest.raises(ValueError) as error:
        remove_unused_columns(data, signature_columns(TinyModel()), "Evaluation", "TinyModel")
    message = str(error.value)
    assert "['text', 'idx']" in message and "input_ids" in message and "attention_mask" in message
    assert "remove_unused_columns=False" in message and "Evaluation" in message


def test_collator_drops_keys_of_dict_items_only(caplog):
    seen = []

    def collate(features):
        seen.append(features)
        return len(features)

    collator = RemoveColumnsCollator(collate, ["input_ids", "labels"], "Training", "TinyModel")
    features = [{"input_ids": [1], "labels": 0, "text": "a"}, {"input_ids": [2], "labels": 1, "text": "b"}]
    with caplog.at_level(logging.INFO, logger="lathe.train.data.columns"):
        assert collator(features) == 2
        collator(features)
    assert seen[0] == [{"input_ids": [1], "labels": 0}, {"input_ids": [2], "labels": 1}]
    assert caplog.text.count("have been ignored: text") == 1
    collator([(1, 2), ([3], 4)])
    assert seen[-1] == [(1, 2), ([3], 4)]


def test_prune_on_a_list_of_dicts_wraps_the_collator_in_a_dataloader():
    items = [{"index": i, "input_ids": torch.tensor([i]), "note": "x"} for i in range(4)]
    data, collator = prune_unused_columns(items, torch.utils.data.default_collate, signature_columns(TinyModel()))
    assert data is items
    batch = next(iter(build_dataloader(data, batch_size=4, collate_fn=collator)))
    assert set(batch) == {"input_ids"}


# ---- item checks and imports ----


def test_validate_item():
    validate_item({"input_ids": [1]}, 0)
    validate_item((torch.zeros(1), 1), 0)
    validate_item([1, 2], 0)
    with pytest.raises(TypeError, match=r"Dataset item 3 is a str.*dict.*tuple/list"):
        validate_item("raw text", 3)
    with pytest.raises(TypeError, match="item 0 is a int"):
        validate_first_item([5, 6])
    validate_first_item([])
    validate_first_item(Stream(3))


def test_importing_data_does_not_import_transformers_or_datasets():
    code = "import sys, lathe.train.data.sampling; assert not {'transformers', 'datasets'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("drop_last", [False, True])
def test_sharded_batches_are_accelerates(drop_last):
    """Under N processes each shard gets the batches accelerate's BatchSamplerShard (even_batches) gives
    transformers' ranks: a short last batch completed from the epoch's first samples, extra batches of
    those samples until every shard has as many; with drop_last an incomplete round is dropped."""
    accelerate_data = pytest.importorskip("accelerate.data_loader")
    from torch.utils.data import BatchSampler, SequentialSampler

    for samples in range(1, 30):
        for batch_size in (1, 2, 3):
            for shards in (2, 3):
                for index in range(shards):
                    ours = ResumableBatchSampler(
                        SequentialSampler(range(samples)), batch_size, drop_last, num_shards=shards, shard_index=index
                    )
                    theirs = accelerate_data.BatchSamplerShard(
                        BatchSampler(SequentialSampler(range(samples)), batch_size, drop_last),
                        num_processes=shards,
                        process_index=index,
                        split_batches=False,
                        even_batches=True,
                    )
                    assert list(ours) == list(theirs), (samples, batch_size, shards, index)
                    assert len(ours) == len(list(theirs)), (samples, batch_size, shards, index)
