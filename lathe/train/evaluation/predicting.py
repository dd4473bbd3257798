"""What the Trainer's evaluate(), predict() and prediction_step() do (one batch through the model
without gradients); the batch loop itself is lathe.train.evaluation.loop.evaluation_loop. Trainer's methods
of those names (trainer.py) call these functions, so overriding any of them changes what the others do."""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from lathe.train import batching, runtime
from lathe.train.evaluation import loop as evaluation
from lathe.train.evaluation.outputs import EvalLoopOutput, PredictionOutput
from lathe.train.features import hp_search
from lathe.train.optim import schedules
from lathe.train.parallel import distributed


def evaluate(trainer, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
    """Metrics prefixed with `metric_key_prefix`; a dict of eval datasets gives `eval_<name>_*`."""
    datasets = eval_dataset if eval_dataset is not None else trainer.eval_dataset
    if isinstance(datasets, Mapping):
        metrics = {}
        for name, dataset in datasets.items():
            # The trainer's own datasets go by name, as in transformers (get_eval_dataloader keys on it).
            which = dataset if eval_dataset is not None else name
            metrics.update(trainer.evaluate(which, ignore_keys, f"{metric_key_prefix}_{name}"))
        return metrics
    trainer._memory_tracker.start("eval")
    dataloader = trainer.get_eval_dataloader(eval_dataset)
    start = time.time()
    output = trainer.evaluation_loop(
        dataloader,
        description="Evaluation",
        # Without compute_metrics there is nothing to do with predictions: keep only the loss.
        prediction_loss_only=True if trainer.compute_metrics is None else None,
        ignore_keys=ignore_keys,
        metric_key_prefix=metric_key_prefix,
    )
    output.metrics.update(
        evaluation.speed_metrics(
            metric_key_prefix,
            start,
            num_samples=output.num_samples,
            num_steps=_steps(output.num_samples, trainer.args.eval_batch_size),
        )
    )
    trainer.log(output.metrics)
    trainer.control = trainer.callback_handler.on_evaluate(trainer.args, trainer.state, trainer.control, output.metrics)
    trainer._memory_tracker.stop_and_update_metrics(output.metrics, stage="eval")  # after the log, as transformers
    return output.metrics


def predict(trainer, test_dataset, ignore_keys=None, metric_key_prefix: str = "test") -> PredictionOutput:
    trainer._memory_tracker.start("test")
    dataloader = trainer.get_test_dataloader(test_dataset)
    start = time.time()
    output = trainer.evaluation_loop(
        dataloader, description="Prediction", ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix
    )
    output.metrics.update(
        evaluation.speed_metrics(
            metric_key_prefix,
            start,
            num_samples=output.num_samples,
            num_steps=_steps(output.num_samples, trainer.args.eval_batch_size),
        )
    )
    trainer.control = trainer.callback_handler.on_predict(trainer.args, trainer.state, trainer.control, output.metrics)
    trainer._memory_tracker.stop_and_update_metrics(output.metrics, stage="test")
    return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=output.metrics)


def evaluation_loop(
    trainer,
    dataloader,
    description: str,
    prediction_loss_only: bool | None = None,
    ignore_keys=None,
    metric_key_prefix: str = "eval",
) -> EvalLoopOutput:
    if prediction_loss_only is None:
        prediction_loss_only = trainer.args.prediction_loss_only
    full_eval_dtype = runtime.full_eval_dtype(trainer.args)
    if full_eval_dtype is not None and not trainer.is_in_train:  # the whole model cast, and it stays cast
        trainer.model = trainer.model.to(dtype=full_eval_dtype, device=trainer.args.device)
    with torch.no_grad():
        return evaluation.evaluation_loop(
            trainer, dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
        )


def prediction_step(trainer, model, inputs, prediction_loss_only: bool, ignore_keys=None):
    """(loss, logits, labels) for one batch; loss is None when the batch has no labels."""
    if not isinstance(inputs, Mapping):
        # A tuple batch goes to model(*batch), which returns the loss first (the tuple contract).
        inputs = trainer._prepare_inputs(inputs)
        with torch.no_grad(), runtime.autocast_context(trainer.args, trainer._autocast_dtype):
            outputs = model(*inputs)
        loss, logits = _split_tuple_outputs(outputs)
        return (loss, None, None) if prediction_loss_only else (loss, logits, None)
    has_labels = bool(trainer.label_names) and all(inputs.get(name) is not None for name in trainer.label_names)
    return_loss = inputs.get("return_loss")
    if return_loss is None:
        return_loss = trainer.can_return_loss
    loss_without_labels = not trainer.label_names and return_loss
    inputs = trainer._prepare_inputs(inputs)
    if ignore_keys is None:
        ignore_keys = list(getattr(getattr(model, "config", None), "keys_to_ignore_at_inference", None) or [])
    labels = None
    if has_labels or loss_without_labels:
        labels = tuple(inputs.get(name).detach() for name in trainer.label_names if inputs.get(name) is not None)
        labels = labels[0] if len(labels) == 1 else (labels or None)
    with torch.no_grad(), runtime.autocast_context(trainer.args, trainer._autocast_dtype):
        if has_labels or loss_without_labels:
            # The chunked causal-LM loss never builds the logits; only predictions that are kept need them.
            trainer._logits_wanted = not prediction_loss_only
            # transformers counts the batch's label items here too (over every label position unless
            # the model's loss_type shifts them), so the loss is divided as in training.
            num_items = _batch_items(trainer, inputs)
            try:
                with trainer.compute_loss_context_manager():
                    loss, outputs = trainer.compute_loss(
                        model, inputs, return_outputs=True, num_items_in_batch=num_items
                    )
                if num_items is not None and trainer.args.average_tokens_across_devices:
                    loss = loss * distributed.world_size()  # transformers' compute_loss scales it so
            finally:
                trainer._logits_wanted = False
            loss = loss.detach().mean()
            skip = set(ignore_keys) | {"loss"}
        else:
            loss = None
            outputs = model(**inputs)
            skip = set(ignore_keys)
    if prediction_loss_only:
        return loss, None, None
    if isinstance(outputs, Mapping):
        logits = tuple(value for key, value in outputs.items() if key not in skip and value is not None)
    elif isinstance(outputs, (tuple, list)):
        logits = tuple(outputs[1:] if loss is not None else outputs)
    else:
        logits = (outputs,)
    logits = tuple(v.detach() if torch.is_tensor(v) else v for v in logits)
    if len(logits) == 1:
        logits = logits[0]
    elif len(logits) == 0:
        logits = None
    return loss, logits, labels


def evaluate_during_training(trainer, trial, ignore_keys_for_eval, skip_scheduler: bool = False) -> dict:
    """Evaluation during training; also feeds ReduceLROnPlateau or GreedyLR its metric.

    The global RNG moves on as under transformers: creating the eval dataloader's iterator draws its
    workers' base seed, and a collator that masks at random draws too, so the training steps after an
    evaluation see the dropout masks transformers' steps see."""
    metrics = trainer.evaluate(ignore_keys=ignore_keys_for_eval)
    hp_search.report_to_search(trainer, trial, trainer.state.global_step, metrics)  # optuna may prune here
    if schedules.steps_on_metric(trainer.lr_scheduler) and not skip_scheduler:
        name = trainer.args.metric_for_best_model or "loss"
        key = name if name.startswith("eval_") else f"eval_{name}"
        if key not in metrics:
            raise KeyError(
                f"{type(trainer.lr_scheduler).__name__} watches {key!r}, which evaluation did not return (got {sorted(metrics)})."
            )
        trainer.lr_scheduler.step(metrics[key])
    return metrics


def _batch_items(trainer, inputs):
    """The batch's num_items_in_batch, as transformers' prediction_step passes it to compute_loss:
    counted when the model takes loss kwargs or a compute_loss_func is set, summed over ranks with
    average_tokens_across_devices (training's count, batching.count_window_items, on one batch)."""
    args = trainer.args
    return batching.count_window_items(
        [inputs], trainer._counts_items(), trainer._loss_shifts_labels, args.device, args.average_tokens_across_devices
    )


def _steps(num_samples: int, batch_size: int) -> int:
    return -(-num_samples // max(batch_size, 1))


def _split_tuple_outputs(outputs):
    if torch.is_tensor(outputs):
        return (outputs.detach().mean() if outputs.dim() == 0 else None), (
            None if outputs.dim() == 0 else outputs.detach()
        )
    if isinstance(outputs, Mapping):
        loss = outputs.get("loss")
        rest = tuple(v for k, v in outputs.items() if k != "loss")
        return (loss.detach().mean() if loss is not None else None), (rest[0] if len(rest) == 1 else rest or None)
    loss = outputs[0].detach().mean()
    rest = tuple(o.detach() for o in outputs[1:] if torch.is_tensor(o))
    return loss, (rest[0] if len(rest) == 1 else rest or None)
