"""lathe.train: the Trainer library (the transformers Trainer API on plain PyTorch). At this level the Trainer
(trainer.py, surface.py, queries.py, seq2seq.py), the loop (loop.py, stepping.py, batching.py, run.py,
session.py, runtime.py), and saving and exact resume (saving.py, resume.py, state.py, seed.py); below them
one folder per concern: args/, data/ (the collators), checkpoints/ (the file format), optim/, parallel/,
callbacks/ (reporters inside), loss/, evaluation/, features/. The folders never import this level's loop or
Trainer; lathe.train never imports lathe.llm."""

from lathe._lazy import make_getattr

EXPORTS = {
    # arguments and parsing
    "TrainingArguments": "lathe.train.args.training_args",
    "Seq2SeqTrainingArguments": "lathe.train.args.training_args",
    "IntervalStrategy": "lathe.train.args.training_args",
    "SaveStrategy": "lathe.train.args.training_args",
    "SchedulerType": "lathe.train.args.training_args",
    "OptimizerNames": "lathe.train.args.training_args",
    "HfArgumentParser": "lathe.train.args.parser",
    "ArgumentParser": "lathe.train.args.parser",
    # state and callbacks
    "TrainerState": "lathe.train.state",
    "TrainerControl": "lathe.train.state",
    "ExportableState": "lathe.train.state",
    "TrainerCallback": "lathe.train.callbacks.events",
    "CallbackHandler": "lathe.train.callbacks.events",
    "DefaultFlowCallback": "lathe.train.callbacks.events",
    "ProgressCallback": "lathe.train.callbacks.flow",
    "PrinterCallback": "lathe.train.callbacks.flow",
    "EarlyStoppingCallback": "lathe.train.callbacks.flow",
    "GracefulStopCallback": "lathe.train.callbacks.flow",
    # the trainer and its outputs
    "Trainer": "lathe.train.trainer",
    "Seq2SeqTrainer": "lathe.train.seq2seq",
    "EvalPrediction": "lathe.train.evaluation.outputs",
    "TrainOutput": "lathe.train.evaluation.outputs",
    "EvalLoopOutput": "lathe.train.evaluation.outputs",
    "PredictionOutput": "lathe.train.evaluation.outputs",
    # optimisation
    "get_scheduler": "lathe.train.optim.optimizers",
    "Adafactor": "lathe.train.optim.adafactor",
    "AdafactorSchedule": "lathe.train.optim.adafactor",
    "get_adafactor_schedule": "lathe.train.optim.adafactor",
    "GreedyLR": "lathe.train.optim.greedy",
    "get_greedy_schedule": "lathe.train.optim.greedy",
    "get_constant_schedule": "lathe.train.optim.named_schedules",
    "get_constant_schedule_with_warmup": "lathe.train.optim.named_schedules",
    "get_cosine_schedule_with_warmup": "lathe.train.optim.named_schedules",
    "get_cosine_with_hard_restarts_schedule_with_warmup": "lathe.train.optim.named_schedules",
    "get_cosine_with_min_lr_schedule_with_warmup": "lathe.train.optim.named_schedules",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate": "lathe.train.optim.named_schedules",
    "get_inverse_sqrt_schedule": "lathe.train.optim.named_schedules",
    "get_linear_schedule_with_warmup": "lathe.train.optim.named_schedules",
    "get_polynomial_decay_schedule_with_warmup": "lathe.train.optim.named_schedules",
    "get_reduce_on_plateau_schedule": "lathe.train.optim.named_schedules",
    "get_wsd_schedule": "lathe.train.optim.named_schedules",
    # data
    "default_data_collator": "lathe.train.data.collators",
    "DefaultDataCollator": "lathe.train.data.collators",
    "DataCollatorWithPadding": "lathe.train.data.collators",
    "DataCollatorForSeq2Seq": "lathe.train.data.collators",
    "DataCollatorForLanguageModeling": "lathe.train.data.masking",
    "DataCollatorWithFlattening": "lathe.train.data.collators",
    "DataCollatorForTokenClassification": "lathe.train.data.token_collators",
    "DataCollatorForMultipleChoice": "lathe.train.data.token_collators",
    "DataCollatorForPermutationLanguageModeling": "lathe.train.data.permutation",
    "DataCollatorMixin": "lathe.train.data.collator_base",
    # reproducibility and checkpoints
    "set_seed": "lathe.train.seed",
    "enable_full_determinism": "lathe.train.seed",
    "get_last_checkpoint": "lathe.train.checkpoints.layout",
    # libraries built on transformers' Trainer, on lathe's
    "patch_transformers": "lathe.train.features.patching",
}

__all__ = sorted(EXPORTS)
__getattr__ = make_getattr(__name__, EXPORTS)


def __dir__():
    return __all__
