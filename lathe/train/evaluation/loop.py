"""The evaluation and prediction loop: batches through prediction_step, predictions gathered on the
CPU as they come (bounded device memory), padded with -100 across batches, then metrics."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import numpy as np
import torch

from lathe.train.data.labels import IGNORE_INDEX
from lathe.train.evaluation.outputs import EvalLoopOutput, EvalPrediction, denumpify_detensorize


def to_numpy(data):
    """Detach nested tensors to CPU numpy (bf16 has no numpy dtype, so it becomes fp32)."""
    if torch.is_tensor(data):
        data = data.detach()
        if data.dtype == torch.bfloat16:
            data = data.float()
        return data.cpu().numpy()
    if isinstance(data, (list, tuple)):
        return type(data)(to_numpy(d) for d in data)
    if isinstance(data, Mapping):
        return type(data)({k: to_numpy(v) for k, v in data.items()})
    return data


def pad_and_concatenate(arrays: list, padding_index: int = IGNORE_INDEX):
    """Concatenate per-batch arrays on axis 0, padding the other axes to the largest shape with
    `padding_index` (e.g. sequence lengths that differ between batches). Gathered merges pairs of
    equal chunks, so each row is copied log n times, not once per batch as a running concatenation."""
    first = arrays[0]
    if isinstance(first, (list, tuple)):
        return type(first)(pad_and_concatenate([a[i] for a in arrays], padding_index) for i in range(len(first)))
    if isinstance(first, Mapping):
        return type(first)({k: pad_and_concatenate([a[k] for a in arrays], padding_index) for k in first})
    arrays = [np.atleast_1d(a) for a in arrays]
    if all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
        return np.concatenate(arrays, axis=0)
    tail = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
    out = np.full((sum(a.shape[0] for a in arrays),) + tail, padding_index, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        out[(slice(row, row + a.shape[0]),) + tuple(slice(0, s) for s in a.shape[1:])] = a
        row += a.shape[0]
    return out


class Gathered:
    """Predictions (or labels, inputs, losses) of an evaluation, kept on the CPU. Up to
    `transfer_every` batches wait on the device, then move together (fewer syncs on GPU)."""

    def __init__(self, transfer_every: int, concatenate: bool = True):
        self.transfer_every = max(int(transfer_every or 1), 1)
        self.concatenate = concatenate
        self.on_device: list = []
        self.on_cpu: list = []
        self._batches_per_chunk: list[int] = []  # on_cpu[i] holds this many batches (merged below)

    def add(self, value) -> None:
        if value is None:
            return
        self.on_device.append(value)
        if len(self.on_device) >= self.transfer_every:
            self.flush()

    def flush(self) -> None:
        for value in self.on_device:
            self.on_cpu.append(to_numpy(value))
            self._batches_per_chunk.append(1)
            self._merge_equal_chunks()
        self.on_device.clear()

    def _merge_equal_chunks(self) -> None:
        """Merge the last two chunks while they hold as many batches each (a binary counter: log n
        chunks, each row copied log n times). Thousands of small arrays kept between the large,
        varying-size logits of each batch fragment glibc's heap: RSS grew ~0.8 MB per batch on the
        lm bench (84 MB at 80 batches vs 38 MB at 8); merged, it stays flat (~40 MB, as transformers).
        Under several processes, result() interleaves the ranks batch by batch, so nothing merges."""
        if not self.concatenate or _is_distributed():
            return
        sizes = self._batches_per_chunk
        while len(sizes) > 1 and sizes[-1] == sizes[-2]:
            self.on_cpu[-2:] = [pad_and_concatenate(self.on_cpu[-2:])]
            sizes[-2:] = [sizes[-2] * 2]

    def result(self, total: int | None = None):
        """Everything gathered; under several processes, every rank's batches in dataset order,
        cut to `total` rows (even sharding repeats a few samples at the end)."""
        self.flush()
        if _is_distributed():
            from lathe.train.parallel import distributed

            self.on_cpu = distributed.interleave_batches(distributed.gather_objects(self.on_cpu))
        if not self.on_cpu:
            return None
        if not self.concatenate:
            return self.on_cpu
        return _first_rows(pad_and_concatenate(self.on_cpu), total)


def _is_distributed() -> bool:
    from lathe.train.parallel import distributed  # lazily: distributed imports this module's helpers

    return distributed.is_distributed()


def _first_rows(data, total: int | None):
    if total is None:
        return data
    if isinstance(data, (list, tuple)):
        return type(data)(_first_rows(d, total) for d in data)
    if isinstance(data, Mapping):
        return type(data)({k: _first_rows(v, total) for k, v in data.items()})
    return data[:total]


def observed_batch_size(inputs) -> int:
    if isinstance(inputs, Mapping):
        for value in inputs.values():
            if torch.is_tensor(value) and value.dim() > 0:
                return value.shape[0]
        return 1
    if isinstance(inputs, (list, tuple)) and inputs and torch.is_tensor(inputs[0]):
        return inputs[0].shape[0]
    return 1


class WeightedLoss:
    """eval_loss as transformers computes it: each batch's loss repeated `weight` times (see
    loss_weight), the repeats of all batches concatenated in the loss's own dtype (float32, bf16 read
    as float32) and averaged by NumPy, so the value is bit for bit transformers'. The batch losses
    wait on the device (no host sync per batch) and move once, at the end. With
    logging_nan_inf_filter, non-finite entries are left out, as transformers does."""

    def __init__(self, nan_inf_filter: bool, total_samples: int | None = None):
        from lathe.train.parallel import distributed

        self.nan_inf_filter = nan_inf_filter
        self.count = None
        self.losses: list[torch.Tensor] = []
        self.weights: list[int] = []
        # Under several processes: each batch's (loss, size), to weigh every rank's batches in dataset
        # order and leave out the samples even sharding repeats.
        self.per_batch = [] if distributed.is_distributed() else None
        self.total_samples = total_samples

    def _mean_over_ranks(self) -> float:
        from lathe.train.parallel import distributed

        batches = distributed.interleave_batches(distributed.gather_objects(self.per_batch))
        remaining = self.total_samples if self.total_samples is not None else sum(size for _, size in batches)
        total = count = 0.0
        for loss, size in batches:
            size = min(size, remaining)
            remaining -= size
            if size and not (self.nan_inf_filter and not math.isfinite(loss)):
                total, count = total + loss * size, count + size
        return total / count if count else float("nan")

    def add(self, loss: torch.Tensor, batch_size: int, weight: int | None = None) -> None:
        if self.per_batch is not None:
            self.per_batch.append((float(loss.detach().double()), batch_size))
            self.count = (self.count or 0) + batch_size
            return
        self.losses.append(loss.detach().reshape(()))
        self.weights.append(batch_size if weight is None else weight)
        self.count = (self.count or 0) + batch_size

    def mean(self) -> float:
        if self.per_batch is not None:
            return self._mean_over_ranks()
        losses = np.repeat(to_numpy(torch.stack(self.losses)), self.weights)
        finite = np.isfinite(losses)
        if self.nan_inf_filter and finite.any():
            losses = losses[finite]
        return losses.mean().item()


def loss_weight(trainer, observed: int, is_last: bool, dataset_size: int | None) -> int:
    """How many times transformers counts a batch's loss in eval_loss: it repeats every batch's loss
    eval_batch_size times (not the batch's own size), and accelerate's gather_for_metrics trims only
    the last batch: to the dataset's remainder when the dataset has a length, to the batch's own size
    for an iterable dataset (accelerate dispatches those). Seq2SeqTrainer gathers without trimming
    (`_trims_last_eval_batch` False), so there a short last batch counts as a full one."""
    weight = trainer.args.eval_batch_size or observed
    if not is_last or not trainer._trims_last_eval_batch:
        return weight
    if dataset_size is None:
        return min(weight, observed)
    remainder = 0 if trainer.args.dataloader_drop_last else dataset_size % weight
    return min(weight, remainder) if remainder else weight


def _mark_last(iterable):
    """Yield (is_last, item), looking one item ahead: iterable datasets have no length."""
    iterator = iter(iterable)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield False, current
        current = following
    yield True, current


class _Collected:
    """What an evaluation keeps of its batches: the weighted loss, and (unless only the loss is wanted)
    predictions, labels and, per include_for_metrics, the main inputs and per-sample losses."""

    def __init__(self, args, dataset_size: int | None):
        every, concatenate = args.eval_accumulation_steps, args.eval_do_concat_batches
        self.preds, self.labels = Gathered(every, concatenate), Gathered(every, concatenate)
        self.inputs, self.losses = Gathered(every, concatenate), Gathered(every, concatenate)
        self.include = set(args.include_for_metrics or [])
        self.loss = WeightedLoss(args.logging_nan_inf_filter, dataset_size)
        self.dataset_size = dataset_size
        self.num_samples = 0

    def add(self, loss, logits, labels, main_inputs, batch_size: int, keep_predictions: bool, weight: int) -> None:
        self.num_samples += batch_size
        if loss is not None:
            self.loss.add(loss, batch_size, weight)
        if keep_predictions:
            self.preds.add(logits)
            self.labels.add(labels)
            self.inputs.add(main_inputs)
            if "loss" in self.include and loss is not None:
                self.losses.add(loss.detach().repeat(weight))

    def prediction(self, logits, labels, main_inputs, loss, batch_size: int) -> EvalPrediction:
        """One batch's EvalPrediction, for batch_eval_metrics."""
        return EvalPrediction(
            predictions=logits,
            label_ids=labels,
            inputs=main_inputs if "inputs" in self.include else None,
            losses=loss.detach().repeat(batch_size) if ("loss" in self.include and loss is not None) else None,
        )

    def final_prediction(self, predictions, label_ids) -> EvalPrediction:
        """The whole evaluation's EvalPrediction, for compute_metrics."""
        size = self.dataset_size
        return EvalPrediction(
            predictions=predictions,
            label_ids=label_ids,
            inputs=self.inputs.result(size) if "inputs" in self.include else None,
            losses=self.losses.result(size) if "loss" in self.include else None,
        )


def evaluation_loop(
    trainer, dataloader, description: str, prediction_loss_only, ignore_keys, metric_key_prefix: str
) -> EvalLoopOutput:
    """Run `trainer.prediction_step` over `dataloader`. eval_loss is weighted by each batch's real
    size, so a partial last batch counts once per sample."""
    args, model = trainer.args, trainer.model
    model.eval()
    trainer.callback_handler.eval_dataloader = dataloader
    collected = _Collected(args, _dataset_size(dataloader))
    batch_metrics_mode = args.batch_eval_metrics and trainer.compute_metrics is not None
    if batch_metrics_mode and collected.loss.per_batch is not None:
        raise NotImplementedError(
            "batch_eval_metrics under several processes is not supported yet: evaluate with "
            "compute_metrics on the gathered predictions (batch_eval_metrics=False)."
        )
    # predict() returns predictions even when metrics are computed batch by batch (transformers too).
    keep_predictions = not batch_metrics_mode or description == "Prediction"
    metrics = None
    for is_last, inputs in _mark_last(dataloader):
        batch_size = observed_batch_size(inputs)
        wanted = isinstance(inputs, Mapping) and "inputs" in collected.include
        main_inputs = inputs.get(trainer.main_input_name) if wanted else None
        loss, logits, labels = trainer.prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if logits is not None and trainer.preprocess_logits_for_metrics is not None:
            logits = trainer.preprocess_logits_for_metrics(logits, labels)
        weight = loss_weight(trainer, batch_size, is_last, collected.dataset_size)
        collected.add(loss, logits, labels, main_inputs, batch_size, keep_predictions, weight)
        if batch_metrics_mode:
            prediction = collected.prediction(logits, labels, main_inputs, loss, batch_size)
            metrics = trainer.compute_metrics(prediction, compute_result=is_last)
        trainer.control = trainer.callback_handler.on_prediction_step(args, trainer.state, trainer.control)
    return _loop_output(
        trainer, collected, metrics if batch_metrics_mode else None, batch_metrics_mode, metric_key_prefix
    )


def _loop_output(
    trainer, collected: _Collected, batch_metrics, batch_metrics_mode: bool, prefix: str
) -> EvalLoopOutput:
    """Gather what the batches left, compute the metrics (unless batch by batch), prefix their names."""
    predictions = collected.preds.result(collected.dataset_size)
    label_ids = collected.labels.result(collected.dataset_size)
    if batch_metrics_mode:
        metrics = batch_metrics or {}
    elif trainer.compute_metrics is not None and predictions is not None and label_ids is not None:
        metrics = trainer.compute_metrics(collected.final_prediction(predictions, label_ids))
    else:
        metrics = {}
    metrics = denumpify_detensorize(dict(metrics))
    if collected.loss.count is not None:
        metrics[f"{prefix}_loss"] = collected.loss.mean()
    for key in list(metrics):
        if not key.startswith(f"{prefix}_"):
            metrics[f"{prefix}_{key}"] = metrics.pop(key)
    total = collected.dataset_size if collected.dataset_size is not None else collected.num_samples
    return EvalLoopOutput(predictions=predictions, label_ids=label_ids, metrics=metrics, num_samples=total)


def _dataset_size(dataloader) -> int | None:
    dataset = getattr(dataloader, "dataset", None)
    try:
        return len(dataset) if dataset is not None else None
    except TypeError:
        return None


def speed_metrics(
    split: str,
    start_time: float,
    num_samples: int | None = None,
    num_steps: int | None = None,
    num_tokens: int | None = None,
) -> dict:
    """{split}_runtime and throughput, measured from start_time (time.time())."""
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime == 0:
        return result
    if num_samples is not None:
        result[f"{split}_samples_per_second"] = round(num_samples / runtime, 3)
    if num_steps is not None:
        result[f"{split}_steps_per_second"] = round(num_steps / runtime, 3)
    if num_tokens is not None:
        result[f"{split}_tokens_per_second"] = round(num_tokens / runtime, 3)
    return result


def is_better(metric: float, best: float | None, greater_is_better: bool) -> bool:
    if best is None:
        return True
    if isinstance(metric, float) and math.isnan(metric):
        return False
    return metric > best if greater_is_better else metric < best
