"""TrainingArguments and its parser: training_args.py holds the class, its fields in one table, derived.py the
values computed from them (device, ranks, batch sizes, JSON), enums.py the strategy and optimizer names,
validation.py the checks run once at construction, coercion.py the conversion of strings to field types,
deprecated.py, setters.py and integrations.py the rest of transformers' surface (the mixins hold behaviour,
no fields); parser.py is HfArgumentParser. May import lathe.train.runtime, lathe.train.parallel and
lathe.train.callbacks.reporters (the report_to names), nothing else of the Trainer. Checkpoints written
before the folders existed pickle TrainingArguments under this package's path, so it names the classes."""

from lathe._lazy import make_getattr

_EXPORTS = {
    "TrainingArguments": "lathe.train.args.training_args",
    "Seq2SeqTrainingArguments": "lathe.train.args.training_args",
    "IntervalStrategy": "lathe.train.args.enums",
    "SaveStrategy": "lathe.train.args.enums",
    "SchedulerType": "lathe.train.args.enums",
    "OptimizerNames": "lathe.train.args.enums",
}
__getattr__ = make_getattr(__name__, _EXPORTS)
