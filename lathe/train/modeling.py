"""What the Trainer needs to know about a model: its forward signature (loss kwargs, label names,
main input) and how to read the loss from whatever it returns."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelFacts:
    accepts_loss_kwargs: bool  # forward takes **kwargs (num_items_in_batch reaches the loss)
    label_names: list[str]
    can_return_loss: bool  # forward has return_loss=True (contrastive models)
    main_input_name: str
    shifts_labels: bool  # a causal LM: its first label never enters the loss


def inspect_model(model: nn.Module, label_names: list[str] | None = None) -> ModelFacts:
    inner = getattr(model, "get_base_model", lambda: model)()  # PEFT wraps the real model
    forward = inspect.signature(inner.forward).parameters
    if hasattr(inner, "accepts_loss_kwargs"):
        accepts = bool(inner.accepts_loss_kwargs)
    else:
        accepts = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in forward.values())
    found = [name for name in forward if "label" in name]
    if "start_positions" in forward and "end_positions" in forward:
        found = ["start_positions", "end_positions"]  # question answering heads
    return_loss = forward.get("return_loss")
    return ModelFacts(
        accepts_loss_kwargs=accepts,
        label_names=list(label_names) if label_names is not None else found,
        can_return_loss=bool(return_loss is not None and return_loss.default is True),
        main_input_name=getattr(inner, "main_input_name", "input_ids"),
        shifts_labels=type(inner).__name__.endswith("ForCausalLM"),
    )


def loss_from_outputs(outputs, inputs) -> torch.Tensor:
    """The loss from a dict with "loss", a tuple whose first element is the loss, or a scalar."""
    if isinstance(outputs, Mapping):
        if outputs.get("loss") is None:
            had_labels = isinstance(inputs, Mapping) and "labels" in inputs
            raise ValueError(
                f"The model returned no loss: its output has keys {sorted(outputs)}, and 'labels' "
                f"{'were' if had_labels else 'were not'} among its inputs "
                f"({sorted(inputs) if isinstance(inputs, Mapping) else 'positional'}). Return a 'loss' from forward, "
                "pass labels (label_names), or give Trainer a compute_loss_func."
            )
        return outputs["loss"]
    if torch.is_tensor(outputs):
        if outputs.dim() == 0:
            return outputs
        raise ValueError(
            f"The model returned a tensor of shape {tuple(outputs.shape)}, not a scalar loss; return (loss, ...) or a dict with 'loss'."
        )
    if isinstance(outputs, (tuple, list)) and outputs and torch.is_tensor(outputs[0]) and outputs[0].dim() == 0:
        return outputs[0]
    raise ValueError(
        f"The model returned {type(outputs).__name__}, which has no loss: return a scalar loss, a tuple "
        "whose first element is the loss, or a dict with a 'loss' key."
    )


# torch's messages when a loss gets labels of the wrong dtype; they name neither the batch key nor the fix.
_LABEL_DTYPE_ERROR = re.compile(
    r"expected target dtype to be Long|expected scalar type Long but found|Expected dtype int(32/int)?64 for index|"
    r"Expected floating point type for target|Target size \(.*\) must be the same as input size"
)


def explain_label_error(error: Exception, inputs, label_names: list[str]) -> Exception | None:
    """A TypeError naming the labels, their dtype and the dtype the loss expects, when `error` is a
    loss rejecting the labels' dtype; else None (the error is about something else)."""
    if not isinstance(error, (RuntimeError, ValueError)) or not _LABEL_DTYPE_ERROR.search(str(error)):
        return None
    if not isinstance(inputs, Mapping):
        return None
    name = next((name for name in [*label_names, "labels"] if torch.is_tensor(inputs.get(name))), None)
    if name is None:
        return None
    labels, message = inputs[name], str(error)
    ids = f"Make the dataset's {name!r} column integer class ids (or convert them in the data collator)."
    if "floating point type for target" in message:
        expected = "floats: labels with the logits' shape are read as class probabilities"
        fix = "Give class ids without the class dimension, or float probabilities."
    elif "Target size" in message and labels.is_floating_point():
        expected, fix = (
            (
                "torch.int64 class ids: transformers' classification models read float labels as multi-label "
                "targets, one 0/1 value per class"
            ),
            ids,
        )
    elif labels.is_floating_point() or labels.dtype != torch.int64:
        expected, fix = "torch.int64 (long) class ids", ids
    else:
        return None
    return TypeError(
        f"The model's loss cannot use `{name}` of dtype {labels.dtype} (shape {list(labels.shape)}): it "
        f"expects {expected}. {fix} torch said: {message.splitlines()[0]}"
    )


def compute_loss(
    model,
    inputs,
    num_items_in_batch=None,
    *,
    label_smoother=None,
    compute_loss_func=None,
    accepts_loss_kwargs: bool = False,
    shifts_labels: bool = False,
):
    """(loss, outputs) of one forward pass, as transformers' Trainer.compute_loss computes it: the model's
    own loss, or label smoothing / compute_loss_func applied to its outputs with the labels taken out
    of the inputs. num_items_in_batch (label tokens of the whole accumulation window) reaches whichever
    computes the loss, so it can divide by the window's count instead of the micro-batch's."""
    labels = None
    if (
        (label_smoother is not None or compute_loss_func is not None)
        and isinstance(inputs, Mapping)
        and "labels" in inputs
    ):
        inputs = dict(inputs)
        labels = inputs.pop("labels")
    if isinstance(inputs, Mapping):
        if accepts_loss_kwargs and num_items_in_batch is not None:
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        outputs = model(**inputs)
    else:
        outputs = model(*inputs)
    if labels is None:
        return loss_from_outputs(outputs, inputs), outputs
    if compute_loss_func is not None:
        return compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch), outputs
    return label_smoother(outputs, labels, shift_labels=shifts_labels, num_items_in_batch=num_items_in_batch), outputs


class FlopsEstimate:
    """Floating-point operations of a forward + backward pass, for total_flos: transformers 5's estimate,
    6 x input positions x non-embedding parameters, for models with num_parameters (its PreTrainedModel
    no longer has floating_point_ops, so asking the model gave 0 for every transformers model); else the
    model's own floating_point_ops, if any. What to count with is looked up once per model: counting
    parameters walks every module (~0.7 ms for a small LM) and a missing attribute costs a raised error."""

    def __init__(self, model):
        self.model = model
        self.main_input = getattr(model, "main_input_name", "input_ids")
        self.parameters = model.num_parameters(exclude_embeddings=True) if hasattr(model, "num_parameters") else None
        self.counter = getattr(model, "floating_point_ops", None)

    def __call__(self, inputs: Mapping) -> int:
        if self.parameters is not None and self.main_input in inputs:
            return 6 * inputs[self.main_input].numel() * self.parameters
        return self.counter(inputs) if self.counter is not None else 0


def floating_point_ops(trainer, inputs) -> int:
    """Trainer.floating_point_ops: operations of one forward + backward pass over `inputs` (FlopsEstimate),
    for total_flos; the estimate is made once per model."""
    if not isinstance(inputs, Mapping):
        return 0
    estimate = trainer._flops_estimate
    if estimate is None or estimate.model is not trainer.model:
        estimate = trainer._flops_estimate = FlopsEstimate(trainer.model)
    return estimate(inputs)
