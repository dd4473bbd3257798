"""The Trainer's dataloaders: column pruning by the model's signature, item checks, and the
resumable samplers of lathe.train.data, configured from TrainingArguments."""
from __future__ import annotations

from lathe.train import batching, columns, data


class TrainerDataLoaders:
    """Mixed into Trainer; override get_train_dataloader / get_eval_dataloader / get_test_dataloader."""

    def _signature_columns(self) -> list[str]:
        inner = getattr(self.model, "get_base_model", lambda: self.model)()
        return columns.signature_columns(inner, self.label_names)

    def _build_dataloader(self, dataset, description: str, batch_size: int, train: bool):
        args = self.args
        collate = self.data_collator
        if args.remove_unused_columns:
            dataset, collate = columns.prune_unused_columns(dataset, collate, self._signature_columns(), description, type(self.model).__name__)
        if self._default_collator_used:
            columns.validate_first_item(dataset)
        strategy = getattr(args.train_sampling_strategy, "value", args.train_sampling_strategy)
        return data.build_dataloader(
            dataset, batch_size=batch_size, collate_fn=collate,
            shuffle=train and strategy == "random",
            seed=args.data_seed if args.data_seed is not None else args.seed,
            drop_last=args.dataloader_drop_last, num_workers=args.dataloader_num_workers,
            pin_memory=args.dataloader_pin_memory, persistent_workers=args.dataloader_persistent_workers,
            prefetch_factor=args.dataloader_prefetch_factor,
            group_by_length=train and strategy == "group_by_length",
            length_column_name=args.length_column_name, model_input_name=self.main_input_name,
            length_group_size=batch_size * args.gradient_accumulation_steps,
            num_shards=args.world_size, shard_index=args.process_index,
        )

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs a train_dataset.")
        return self._build_dataloader(self.train_dataset, "training", self._train_batch_size, train=True)

    def get_eval_dataloader(self, eval_dataset=None):
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        eval_dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if eval_dataset is None:
            raise ValueError("Evaluation needs an eval_dataset (pass it to Trainer or to evaluate()).")
        return self._build_dataloader(eval_dataset, "evaluation", self.args.eval_batch_size, train=False)

    def get_test_dataloader(self, test_dataset):
        return self._build_dataloader(test_dataset, "test", self.args.eval_batch_size, train=False)

    def num_examples(self, dataloader) -> int:
        dataset = getattr(dataloader, "dataset", None)
        try:
            return len(dataset)
        except TypeError:
            return len(dataloader) * self.args.per_device_train_batch_size

    def num_tokens(self, dataloader, max_steps: int | None = None) -> int:
        tokens = 0
        for step, batch in enumerate(dataloader):
            tokens += batching.count_input_tokens(batch, "all", self.main_input_name)
            if max_steps is not None and step + 1 >= max_steps:
                break
        return tokens
