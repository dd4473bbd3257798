"""Every public name of transformers' Trainer-side classes and collator module exists in lathe (`hf`): the
names a class exposes (methods, properties, class attributes, dataclass fields) and those a minimal
instance carries (attributes set at construction), as bench/hf_trainer_census.py counts them."""

from __future__ import annotations

import dataclasses
import importlib
import warnings

import pytest
import torch

pytestmark = pytest.mark.hf

CLASSES = {
    "Trainer": ("transformers.trainer", "lathe.trainer"),
    "Seq2SeqTrainer": ("transformers.trainer_seq2seq", "lathe.trainer_seq2seq"),
    "TrainingArguments": ("transformers.training_args", "lathe.training_args"),
    "Seq2SeqTrainingArguments": ("transformers.training_args_seq2seq", "lathe.training_args_seq2seq"),
    "TrainerState": ("transformers.trainer_callback", "lathe.trainer_callback"),
    "TrainerControl": ("transformers.trainer_callback", "lathe.trainer_callback"),
    "TrainerCallback": ("transformers.trainer_callback", "lathe.trainer_callback"),
    "HfArgumentParser": ("transformers.hf_argparser", "lathe.hf_argparser"),
}

# KNOWN PENDING, each added by a branch merged beside this one; the lead empties these after merging them.
# optim_target_modules: branch i15-optim (issue 15). The Trainer methods: branch i17c (issue 17, point 5).
_PENDING_TRAINER = {
    "accelerator", "autocast_smart_context_manager", "compute_loss_context_manager",
    "create_accelerator_and_postprocess", "create_model_card", "deepspeed", "end", "gather_function",
    "get_batch_samples", "get_cp_size", "get_learning_rates", "get_num_trainable_parameters",
    "get_optimizer_cls_and_kwargs", "get_optimizer_group", "get_sp_size", "get_total_train_batch_size",
    "get_tp_size", "hp_name", "hub_model_id", "hyperparameter_search", "init_hf_repo", "is_deepspeed_enabled",
    "is_distributed_loading_by_transformers", "is_fsdp_enabled", "is_fsdp_xla_enabled", "is_fsdp_xla_v1_enabled",
    "is_fsdp_xla_v2_enabled", "is_model_parallel", "load_generation_config", "loss_is_scaled_for_ga",
    "neftune_noise_alpha", "place_model_on_device", "push_to_hub", "set_initial_training_values",
}  # fmt: skip
KNOWN_PENDING = {
    "Trainer": _PENDING_TRAINER,
    "Seq2SeqTrainer": _PENDING_TRAINER,
}


def _instance(name: str, cls, output_dir: str):
    package = cls.__module__.split(".")[0]
    if name.endswith("TrainingArguments"):
        return cls(output_dir=output_dir, report_to="none")
    if name.endswith("Trainer"):
        args_module = "training_args_seq2seq" if name.startswith("Seq2Seq") else "training_args"
        args_name = "Seq2SeqTrainingArguments" if name.startswith("Seq2Seq") else "TrainingArguments"
        args_cls = getattr(importlib.import_module(f"{package}.{args_module}"), args_name)
        return cls(model=torch.nn.Linear(2, 1), args=args_cls(output_dir=output_dir, report_to="none"))
    if name == "HfArgumentParser":

        @dataclasses.dataclass
        class Example:
            value: int = 1

        return cls(Example)
    return cls()


def public_names(name: str, module: str, output_dir: str) -> set[str]:
    cls = getattr(importlib.import_module(module), name)
    names = {attribute for attribute in dir(cls) if not attribute.startswith("_")}
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        instance = _instance(name, cls, output_dir)
    return names | {attribute for attribute in vars(instance) if not attribute.startswith("_")}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_public_name_of_the_class_exists(name, tmp_path):
    pytest.importorskip("transformers")
    theirs_module, ours_module = CLASSES[name]
    theirs = public_names(name, theirs_module, str(tmp_path / "transformers"))
    ours = public_names(name, ours_module, str(tmp_path / "lathe"))
    pending = KNOWN_PENDING.get(name, set())
    assert sorted(theirs - ours - pending) == []
    assert sorted(pending & ours) == [], "already there: drop it from KNOWN_PENDING"


def test_every_public_name_of_the_collator_module_exists():
    theirs = importlib.import_module("transformers.data.data_collator")
    ours = importlib.import_module("lathe.data_collator")
    defined = [
        name
        for name, value in vars(theirs).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == theirs.__name__
    ]
    assert len(defined) >= 14  # the collators, the mixin, the helpers
    assert sorted(name for name in [*defined, "InputDataClass", "DataCollator"] if not hasattr(ours, name)) == []
