"""Census of public names: which public attributes of transformers' Trainer-side classes lathe's classes lack.

Run with an interpreter that has transformers and lathe importable; prints one JSON object. A class's public names
are the names without a leading underscore that its class exposes (methods, properties, class attributes,
dataclass fields) plus those an instance built with minimal arguments carries (attributes set in __init__ or
__post_init__), because users read both the same way (`trainer.model_wrapped`, `args.n_gpu`).
"""

import dataclasses
import json
import sys
import tempfile
import warnings

# (label, transformers import path, lathe import path)
CLASSES = [
    ("Trainer", "transformers.trainer:Trainer", "lathe.trainer:Trainer"),
    ("Seq2SeqTrainer", "transformers.trainer_seq2seq:Seq2SeqTrainer", "lathe.trainer_seq2seq:Seq2SeqTrainer"),
    ("TrainingArguments", "transformers.training_args:TrainingArguments", "lathe.training_args:TrainingArguments"),
    (
        "Seq2SeqTrainingArguments",
        "transformers.training_args_seq2seq:Seq2SeqTrainingArguments",
        "lathe.training_args_seq2seq:Seq2SeqTrainingArguments",
    ),
    ("TrainerState", "transformers.trainer_callback:TrainerState", "lathe.trainer_callback:TrainerState"),
    ("TrainerControl", "transformers.trainer_callback:TrainerControl", "lathe.trainer_callback:TrainerControl"),
    ("TrainerCallback", "transformers.trainer_callback:TrainerCallback", "lathe.trainer_callback:TrainerCallback"),
    ("HfArgumentParser", "transformers.hf_argparser:HfArgumentParser", "lathe.hf_argparser:HfArgumentParser"),
]


def load(path):
    module_name, _, attribute = path.partition(":")
    module = __import__(module_name, fromlist=[attribute])
    return getattr(module, attribute)


def instance_of(label, cls, output_dir):
    """A minimal instance, so attributes set at construction count; None when it cannot be built."""
    import torch

    args_cls = {"Trainer": "TrainingArguments", "Seq2SeqTrainer": "Seq2SeqTrainingArguments"}
    try:
        if label in ("TrainingArguments", "Seq2SeqTrainingArguments"):
            return cls(output_dir=output_dir, report_to="none")
        if label in args_cls:
            package = cls.__module__.split(".")[0]
            module = "training_args" if label == "Trainer" else "training_args_seq2seq"
            arguments = load(f"{package}.{module}:{args_cls[label]}")(output_dir=output_dir, report_to="none")
            return cls(model=torch.nn.Linear(2, 1), args=arguments)
        if label == "HfArgumentParser":

            @dataclasses.dataclass
            class Example:
                value: int = 1

            return cls(Example)
        return cls()
    except Exception as error:  # a class that cannot be built is compared by its class names only
        print(f"census: could not build {cls.__module__}.{label}: {error!r}", file=sys.stderr)
        return None


def public_names(label, cls, output_dir):
    names = {n for n in dir(cls) if not n.startswith("_")}
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    instance = instance_of(label, cls, output_dir)
    if instance is not None:
        names |= {n for n in vars(instance) if not n.startswith("_")}
    return names


def census():
    warnings.simplefilter("ignore")
    result = {"classes": {}, "total_transformers": 0, "total_missing": 0}
    with tempfile.TemporaryDirectory() as output_dir:
        for label, transformers_path, lathe_path in CLASSES:
            theirs = public_names(label, load(transformers_path), output_dir)
            ours = public_names(label, load(lathe_path), output_dir)
            missing = sorted(theirs - ours)
            result["classes"][label] = {
                "transformers": len(theirs),
                "missing": missing,
                "extra_in_lathe": sorted(ours - theirs),
            }
            result["total_transformers"] += len(theirs)
            result["total_missing"] += len(missing)
    return result


if __name__ == "__main__":
    json.dump(census(), sys.stdout, indent=1, sort_keys=True)
