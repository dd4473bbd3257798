"""Code written for transformers runs after replacing the package name in its imports."""

import importlib
import subprocess
import sys

import pytest

HF_IMPORTS = {
    "trainer": ["Trainer"],
    "trainer_seq2seq": ["Seq2SeqTrainer"],
    "training_args": ["TrainingArguments", "OptimizerNames"],
    "training_args_seq2seq": ["Seq2SeqTrainingArguments"],
    "hf_argparser": ["HfArgumentParser"],
    "optimization": ["get_scheduler", "Adafactor"],
    "data_collator": [
        "default_data_collator",
        "DataCollatorWithPadding",
        "DataCollatorForSeq2Seq",
        "DataCollatorForLanguageModeling",
        "DataCollatorWithFlattening",
        "DefaultDataCollator",
    ],
    "trainer_callback": [
        "TrainerCallback",
        "CallbackHandler",
        "DefaultFlowCallback",
        "ProgressCallback",
        "PrinterCallback",
        "EarlyStoppingCallback",
        "TrainerState",
        "TrainerControl",
        "ExportableState",
    ],
    "trainer_utils": [
        "EvalPrediction",
        "TrainOutput",
        "EvalLoopOutput",
        "PredictionOutput",
        "IntervalStrategy",
        "SaveStrategy",
        "SchedulerType",
        "get_last_checkpoint",
        "set_seed",
        "enable_full_determinism",
        "PREFIX_CHECKPOINT_DIR",
    ],
    "trainer_jit_checkpoint": ["CheckpointManager", "JITCheckpointCallback"],
    "utils.logging": ["get_logger", "get_verbosity", "set_verbosity", "set_verbosity_info", "enable_default_handler"],
}

TOP_LEVEL = [
    "Trainer",
    "TrainingArguments",
    "TrainerCallback",
    "CallbackHandler",
    "TrainerState",
    "TrainerControl",
    "ExportableState",
    "DefaultFlowCallback",
    "ProgressCallback",
    "PrinterCallback",
    "EarlyStoppingCallback",
    "EvalPrediction",
    "TrainOutput",
    "EvalLoopOutput",
    "PredictionOutput",
    "IntervalStrategy",
    "SaveStrategy",
    "SchedulerType",
    "OptimizerNames",
    "set_seed",
    "enable_full_determinism",
    "get_last_checkpoint",
    "HfArgumentParser",
    "ArgumentParser",
    "default_data_collator",
    "DataCollatorWithPadding",
    "DataCollatorForSeq2Seq",
    "DataCollatorForLanguageModeling",
    "DataCollatorWithFlattening",
    "get_scheduler",
    "Seq2SeqTrainer",
    "Seq2SeqTrainingArguments",
]


@pytest.mark.parametrize("module", sorted(HF_IMPORTS))
def test_transformers_module_paths_exist_under_lathe(module):
    imported = importlib.import_module(f"lathe.{module}")
    for name in HF_IMPORTS[module]:
        assert hasattr(imported, name), f"lathe.{module} lacks {name}"


def test_top_level_names():
    import lathe

    missing = [name for name in TOP_LEVEL if not hasattr(lathe, name)]
    assert missing == []
    assert lathe.ArgumentParser is lathe.HfArgumentParser
    assert lathe.trainer.Trainer is lathe.Trainer


def test_import_lathe_does_not_import_torch():
    code = "import sys, lathe; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
