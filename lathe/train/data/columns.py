"""Which dataset columns reach model.forward (HF's remove_unused_columns semantics), and the early
check that dataset items are dicts or tuples."""

from __future__ import annotations

import inspect
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence

from torch.utils.data import IterableDataset

logger = logging.getLogger(__name__)


# ---- which columns reach model.forward ----


def is_datasets_dataset(dataset) -> bool:
    """A map-style `datasets.Dataset`, recognised by duck typing so `datasets` is never imported.
    DatasetDict (column_names is a dict) and IterableDataset (no len) are excluded, as in HF."""
    return (
        isinstance(getattr(dataset, "column_names", None), list)
        and hasattr(dataset, "remove_columns")
        and hasattr(dataset, "__len__")
    )


def signature_columns(model, label_names: Sequence[str] | None = None) -> list[str]:
    """The columns model.forward can take: its parameter names, plus "label", "label_ids" (the
    default collator renames those to "labels") and the Trainer's label_names."""
    if hasattr(model, "get_base_model"):
        # A PEFT wrapper's forward is (*args, **kwargs); the base model's signature is the real one. (The
        # base model has a peft_config too, so that attribute does not tell the wrapper from what it wraps.)
        model = model.get_base_model()
    parameters = list(inspect.signature(model.forward).parameters)
    return list(dict.fromkeys(parameters + ["label", "label_ids"] + list(label_names or [])))


def _ignored_columns_message(ignored: list[str], description: str | None, model_name: str) -> str:
    where = f" in the {description} set" if description else ""
    names = ", ".join(ignored)
    return (
        f"The following columns{where} don't have a corresponding argument in `{model_name}.forward` and have "
        f"been ignored: {names}. If {names} are not expected by `{model_name}.forward`, you can safely ignore "
        "this message."
    )


def remove_unused_columns(dataset, columns: Sequence[str], description: str | None = None, model_name: str = "model"):
    """Drop the columns of a `datasets.Dataset` that model.forward does not take (HF semantics)."""
    keep = set(columns)
    ignored = [name for name in dataset.column_names if name not in keep]
    if len(ignored) == len(dataset.column_names):
        where = f"the {description} dataset" if description else "the dataset"
        raise ValueError(
            f"No column of {where} matches an argument of `{model_name}.forward`, so nothing would be left to "
            f"train on. Dataset columns: {list(dataset.column_names)}. Arguments `{model_name}.forward` accepts "
            f"(plus label names): {list(columns)}. Rename the columns to match, or set "
            "`remove_unused_columns=False` in TrainingArguments to keep them all."
        )
    if not ignored:
        return dataset
    logger.info(_ignored_columns_message(ignored, description, model_name))
    return dataset.remove_columns(ignored)


class RemoveColumnsCollator:
    """Wraps a collator to drop the keys model.forward does not take, for datasets that are not a
    `datasets.Dataset`. Only plain dicts are filtered (HF semantics): tuples, lists and
    UserDict-based items such as BatchEncoding pass through unchanged."""

    def __init__(
        self,
        data_collator: Callable,
        signature_columns: Sequence[str],
        description: str | None = None,
        model_name: str | None = None,
    ):
        self.data_collator = data_collator
        self.signature_columns = list(signature_columns)
        self.description = description
        self.model_name = model_name
        self._keep = frozenset(signature_columns)
        self._message_logged = False

    def _remove_columns(self, feature):
        if not isinstance(feature, dict) or feature.keys() <= self._keep:
            return feature  # nothing to drop: skip rebuilding the dict
        if not self._message_logged and self.model_name:
            ignored = [key for key in feature if key not in self._keep]
            logger.info(_ignored_columns_message(ignored, self.description, self.model_name))
            self._message_logged = True
        return {key: value for key, value in feature.items() if key in self._keep}

    def __call__(self, features: list):
        # The common case, plain dicts holding only model inputs, checked without a Python-level
        # loop (iterating a dict gives its keys).
        if set(map(type, features)) == {dict} and self._keep.issuperset(itertools.chain.from_iterable(features)):
            return self.data_collator(features)
        return self.data_collator([self._remove_columns(feature) for feature in features])


def prune_unused_columns(
    dataset, collate_fn: Callable, columns: Sequence[str], description: str | None = None, model_name: str = "model"
):
    """HF's split: a `datasets.Dataset` loses its unused columns once; any other dataset keeps its
    items and the collator drops unused keys per batch. Returns (dataset, collate_fn)."""
    if is_datasets_dataset(dataset):
        return remove_unused_columns(dataset, columns, description, model_name), collate_fn
    return dataset, RemoveColumnsCollator(collate_fn, columns, description, model_name)


# ---- item checks ----


def validate_item(item, index: int = 0) -> None:
    """Fail early and clearly when items are neither dicts nor tuples/lists, instead of deep inside
    a collator or model(**inputs). Call it only with the default collators: a custom collator may
    take any item type (raw strings tokenised in the collator are fine under HF)."""
    if isinstance(item, (Mapping, tuple, list)):
        return
    raise TypeError(
        f"Dataset item {index} is a {type(item).__name__}, but the Trainer's collators expect each item to be a "
        "dict mapping input names to values (e.g. {'input_ids': [...], 'labels': [...]}) or a tuple/list. "
        "Return one of those from the dataset, or pass a data_collator that handles this type."
    )


def validate_first_item(dataset) -> None:
    """validate_item on item 0 of a map-style dataset; an iterable one is not peeked at (that would
    start its stream) and an empty one has nothing to check."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or len(dataset) == 0:
        return
    validate_item(dataset[0], 0)
