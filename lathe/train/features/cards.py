"""The model card's metadata that transformers infers (modelcard.TrainingSummary): the task from the model's
class, the dataset from a `datasets` Dataset, the metric tags from the evaluation's names, and the
model-index results that combine them; hub.create_model_card writes the card."""

from __future__ import annotations

import sys

# The metric names the Hub knows as tags, and the task tags it names (transformers' lists).
METRIC_TAGS = (
    "accuracy",
    "bleu",
    "f1",
    "matthews_correlation",
    "pearsonr",
    "precision",
    "recall",
    "rouge",
    "sacrebleu",
    "spearmanr",
    "wer",
)
TASK_NAMES = {
    "fill-mask": "Masked Language Modeling",
    "image-classification": "Image Classification",
    "image-segmentation": "Image Segmentation",
    "multiple-choice": "Multiple Choice",
    "object-detection": "Object Detection",
    "question-answering": "Question Answering",
    "table-question-answering": "Table Question Answering",
    "text-classification": "Text Classification",
    "text-generation": "Causal Language Modeling",
    "token-classification": "Token Classification",
    "zero-shot-classification": "Zero Shot Classification",
    "automatic-speech-recognition": "Automatic Speech Recognition",
    "audio-classification": "Audio Classification",
}
# Task tag -> the names of transformers' auto-model tables whose classes do that task, in transformers'
# order: a class in several tables gets the last one's task.
_TASK_TABLES = (
    ("text-generation", ("CAUSAL_LM",)),
    ("image-classification", ("IMAGE_CLASSIFICATION",)),
    ("image-segmentation", ("IMAGE_SEGMENTATION",)),
    ("fill-mask", ("MASKED_LM",)),
    ("object-detection", ("OBJECT_DETECTION",)),
    ("question-answering", ("QUESTION_ANSWERING",)),
    ("text2text-generation", ("SEQ_TO_SEQ_CAUSAL_LM",)),
    ("text-classification", ("SEQUENCE_CLASSIFICATION",)),
    ("table-question-answering", ("TABLE_QUESTION_ANSWERING",)),
    ("token-classification", ("TOKEN_CLASSIFICATION",)),
    ("audio-classification", ("AUDIO_CLASSIFICATION",)),
    ("automatic-speech-recognition", ("CTC", "SPEECH_SEQ_2_SEQ")),
    ("zero-shot-image-classification", ("ZERO_SHOT_IMAGE_CLASSIFICATION",)),
    ("image-text-to-text", ("IMAGE_TEXT_TO_TEXT",)),
)


def task_of(model) -> str | None:
    """The task tag transformers infers from the model's class name (None for a model of no auto table)."""
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:  # not a transformers model then: no task to infer
        return None
    name, found = type(model).__name__, None
    for task, tables in _TASK_TABLES:
        for table in tables:
            for value in getattr(modeling_auto, f"MODEL_FOR_{table}_MAPPING_NAMES", {}).values():
                if name in (value if isinstance(value, (tuple, list)) else [value]):
                    found = task
    return found


def dataset_defaults(trainer, dataset_tags, dataset_args):
    """(dataset_tags, dataset_args, dataset_metadata) filled from a `datasets` Dataset (the eval set, else the
    train set) built by a Hub loader; local files (csv, json, ...) name no dataset."""
    one = trainer.eval_dataset if trainer.eval_dataset is not None else trainer.train_dataset
    datasets = sys.modules.get("datasets")  # a Dataset exists only where datasets was imported
    is_dataset = datasets is not None and isinstance(one, (datasets.Dataset, datasets.IterableDataset))
    metadata = None
    if is_dataset:  # create_model_card takes no dataset metadata, so transformers always infers it here
        tag = one.builder_name
        if tag not in ("csv", "json", "pandas", "parquet", "text"):
            metadata = [{"config": one.config_name, "split": str(one.split)}]
            dataset_tags = [tag] if dataset_tags is None else dataset_tags
            dataset_args = [one.config_name] if dataset_args is None else dataset_args
    return dataset_tags, dataset_args, metadata


def metric_tags(results: dict | None) -> dict:
    """{metric tag: the result's name} for the results whose names are Hub metric tags."""
    found = {}
    for key in results or {}:
        tag = key.lower().replace(" ", "_")
        if tag in METRIC_TAGS:
            found[tag] = key
        elif key.lower() == "rouge1":
            found["rouge"] = key
    return found


def _list(value) -> list:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def model_index(model_name, tasks, dataset, dataset_tags, dataset_args, dataset_metadata):
    """A function of (metric tags, results) giving the model-index results: one entry per task and dataset,
    kept only when it has a task, a dataset and metrics (the Hub rejects partial ones)."""
    tags, args = _list(dataset_tags), _list(dataset_args)
    args += [None] * (len(tags) - len(args))
    names, arg_of = dict(zip(tags, _list(dataset))), dict(zip(tags, args))
    metadata_of = dict(zip(tags, _list(dataset_metadata)))
    task_names = {task: TASK_NAMES[task] for task in _list(tasks) if task in TASK_NAMES}

    def results(metrics: dict, values: dict | None) -> list:
        if not task_names and not names:
            return []
        entries = []
        for task in task_names or {None: None}:
            for tag in names or {None: None}:
                entry = {}
                if task is not None:
                    entry["task"] = {"name": task_names[task], "type": task}
                if tag is not None:
                    entry["dataset"] = {"name": names[tag], "type": tag, **metadata_of.get(tag, {})}
                    if arg_of[tag] is not None:
                        entry["dataset"]["args"] = arg_of[tag]
                if metrics:
                    entry["metrics"] = [{"name": n, "type": t, "value": values[n]} for t, n in metrics.items()]
                if {"task", "dataset", "metrics"} <= set(entry):
                    entries.append(entry)
        return entries

    return results
