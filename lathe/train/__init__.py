"""lathe.train: the Trainer library (the transformers Trainer API on plain PyTorch)."""

from lathe._lazy import make_getattr

_EXPORTS = {
    # arguments and parsing
    "TrainingArguments": "lathe.train.args",
    "Seq2SeqTrainingArguments": "lathe.train.args",
    "IntervalStrategy": "lathe.train.args",
    "SaveStrategy": "lathe.train.args",
    "SchedulerType": "lathe.train.args",
    "OptimizerNames": "lathe.train.args",
    "HfArgumentParser": "lathe.train.argparser",
    "ArgumentParser": "lathe.train.argparser",
    # state and callbacks
    "TrainerState": "lathe.train.state",
    "TrainerControl": "lathe.train.state",
    "ExportableState": "lathe.train.state",
    "TrainerCallback": "lathe.train.callbacks",
    "CallbackHandler": "lathe.train.callbacks",
    "DefaultFlowCallback": "lathe.train.flow",
    "ProgressCallback": "lathe.train.flow",
    "PrinterCallback": "lathe.train.flow",
    "EarlyStoppingCallback": "lathe.train.flow",
    "GracefulStopCallback": "lathe.train.flow",
    # the trainer and its outputs
    "Trainer": "lathe.train.trainer",
    "Seq2SeqTrainer": "lathe.train.seq2seq",
    "EvalPrediction": "lathe.train.outputs",
    "TrainOutput": "lathe.train.outputs",
    "EvalLoopOutput": "lathe.train.outputs",
    "PredictionOutput": "lathe.train.outputs",
    # optimisation
    "get_scheduler": "lathe.train.optim",
    # data
    "default_data_collator": "lathe.train.collators",
    "DefaultDataCollator": "lathe.train.collators",
    "DataCollatorWithPadding": "lathe.train.collators",
    "DataCollatorForSeq2Seq": "lathe.train.collators",
    "DataCollatorForLanguageModeling": "lathe.train.masking",
    "DataCollatorWithFlattening": "lathe.train.collators",
    "DataCollatorForTokenClassification": "lathe.train.token_collators",
    "DataCollatorForMultipleChoice": "lathe.train.token_collators",
    "DataCollatorForPermutationLanguageModeling": "lathe.train.permutation",
    "DataCollatorMixin": "lathe.train.collator_base",
    # reproducibility and checkpoints
    "set_seed": "lathe.train.seed",
    "enable_full_determinism": "lathe.train.seed",
    "get_last_checkpoint": "lathe.train.checkpoint",
}

__all__ = sorted(_EXPORTS)
__getattr__ = make_getattr(__name__, _EXPORTS)


def __dir__():
    return __all__
