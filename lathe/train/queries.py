"""What a script may ask a Trainer, with transformers' names and answers: trainable parameters, learning
rates, optimizer groups, batch sizes, the run's initial values, and the parallel sizes (always 1: lathe
has data parallelism only, no tensor, context or sequence parallelism). Attached to Trainer in trainer.py."""

from __future__ import annotations

import sys

import torch

from lathe.train import batching


def get_num_trainable_parameters(trainer) -> int:
    """Elements of the model's parameters that require gradients."""
    return sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)


def _optimizer_or_error(trainer):
    if trainer.optimizer is None:
        raise ValueError("Trainer optimizer is None, please make sure you have setup the optimizer before.")
    return trainer.optimizer


def get_learning_rates(trainer) -> list[float]:
    """The learning rate of each of the optimizer's parameter groups."""
    return [group["lr"] for group in _optimizer_or_error(trainer).param_groups]


def get_optimizer_group(trainer, param: str | torch.nn.Parameter | None = None):
    """The parameter group holding `param`; without it (or when no group holds it), every group's params."""
    optimizer = _optimizer_or_error(trainer)
    if param is not None:
        for group in optimizer.param_groups:
            if any(param is p for p in group["params"]):
                return group
    return [group["params"] for group in optimizer.param_groups]


def get_tp_size(trainer) -> int:
    """Tensor-parallel size: the model's own `_tp_size` when it has one (transformers' tp_plan), else 1."""
    return getattr(trainer.model, "_tp_size", None) or 1


def get_cp_size(trainer) -> int:
    """Context-parallel size: lathe has no context parallelism."""
    return 1


def get_sp_size(trainer) -> int:
    """Sequence-parallel size: lathe has no sequence parallelism."""
    return 1


def get_total_train_batch_size(trainer, args) -> int:
    """Samples per optimizer update over all processes: micro-batch x accumulation x data-parallel ranks."""
    data_parallel = args.world_size // trainer.get_tp_size() // trainer.get_cp_size() // trainer.get_sp_size()
    return trainer._train_batch_size * args.gradient_accumulation_steps * data_parallel


def set_initial_training_values(trainer, args, dataloader) -> tuple:
    """transformers' seven numbers of a run, from lathe's plan (batching.plan_training): (num_train_epochs,
    num_update_steps_per_epoch, num_examples, num_train_samples, total_train_batch_size, steps_in_epoch,
    max_steps)."""
    total_batch_size = trainer.get_total_train_batch_size(args)
    batches = _length(dataloader)
    plan = batching.plan_training(
        args, batches, _length(getattr(dataloader, "dataset", None)), trainer._train_batch_size
    )
    if batches is None:  # an iterable dataset: max_steps windows make up an "epoch"
        examples = samples = total_batch_size * plan.max_steps
        return (
            sys.maxsize,
            plan.max_steps,
            examples,
            samples,
            total_batch_size,
            plan.max_steps * args.gradient_accumulation_steps,
            plan.max_steps,
        )
    examples = trainer.num_examples(dataloader)
    if args.max_steps > 0:
        samples = plan.max_steps * total_batch_size
    else:
        samples = examples * args.num_train_epochs
    return plan.num_train_epochs, plan.updates_per_epoch, examples, samples, total_batch_size, batches, plan.max_steps


def get_batch_samples(trainer, epoch_iterator, num_batches: int, device=None) -> tuple[list, torch.Tensor | None]:
    """Up to `num_batches` batches from `epoch_iterator`, and their loss denominator: the label tokens of all of
    them (summed over ranks with average_tokens_across_devices), or None when the loss is a per-batch mean."""
    batches = []
    for _ in range(num_batches):
        try:
            batches.append(next(epoch_iterator))
        except StopIteration:
            break
    args, num_items = trainer.args, None
    if batches:
        num_items = batching.count_window_items(
            batches,
            trainer._counts_items(),
            trainer._loss_shifts_labels,
            args.device,
            args.average_tokens_across_devices,
        )
    if torch.is_tensor(num_items) and device is not None:
        num_items = num_items.to(device)
    return batches, num_items


def _length(obj) -> int | None:
    try:
        return len(obj) if obj is not None else None
    except TypeError:
        return None


def num_tokens(trainer, dataloader, max_steps: int | None = None) -> int:
    """Input tokens (every position) of the first max_steps batches of `dataloader`, as transformers counts them."""
    tokens = 0
    for step, batch in enumerate(dataloader):
        tokens += batching.count_input_tokens(batch, "all", trainer.main_input_name)
        if max_steps is not None and step + 1 >= max_steps:
            break
    return tokens
