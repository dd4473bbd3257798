"""No TrainingArguments field is silently ignored (issue 17, point 7): every field of TrainingArguments and
Seq2SeqTrainingArguments has an entry in FIELDS saying how this test observes it, and a field without an entry
fails the test. The kinds of entry:

  Changes(observe, value, **context)  setting `value` (on top of `context`, used by both runs) changes what
                                      `observe` sees of a small run, against the same run with the default
  Raises(value, match, **context)     the value is refused (or, in that context, the Trainer reading it fails)
                                      with an error naming it
  Warns(value, match)                 accepted with a warning saying it does nothing (transformers 5.23's
                                      Trainer does not read it either, or removed it)
  Elsewhere(test_file)                needs several processes, a package or a long run: that test file sets it
  Peer(reason)                        transformers' Trainer does not read it either (checked against its source
                                      where transformers is installed); scripts read it

A field added to TrainingArguments needs an entry here; there is no kind for "still ignored"."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from torch import nn

from tests.train.trainer_helpers import pad_collate, tiny_llama, token_items

TESTS = os.path.dirname(__file__)


@dataclass
class Changes:
    observe: str
    value: object
    context: dict = field(default_factory=dict)


@dataclass
class Raises:
    value: object
    match: str
    context: dict = field(default_factory=dict)


@dataclass
class Warns:
    value: object
    match: str


@dataclass
class Elsewhere:
    test_file: str


@dataclass
class Peer:
    reason: str


@dataclass
class Moot:
    """Acts only together with `needs`, which lathe refuses (so this one can never act)."""

    needs: str
    value: object


def C(observe, value, **context):
    return Changes(observe, value, context)


def R(value, match, **context):
    return Raises(value, match, context)


EVAL = dict(eval_strategy="steps", eval_steps=2)
SAVE = dict(save_strategy="steps", save_steps=2)
BEST = dict(**EVAL, **SAVE, metric_for_best_model="loss")
WORKERS = dict(dataloader_num_workers=1)
# Length grouping reads a column of a datasets.Dataset, kept when remove_unused_columns=False (as in transformers).
LENGTHS = dict(model="probe_datasets", remove_unused_columns=False, per_device_train_batch_size=3)
SCRIPTS = "read by scripts (`if training_args.do_train:`), not by the Trainer, in transformers too"

FIELDS = {
    "output_dir": C("folders", "elsewhere", **SAVE),
    "per_device_train_batch_size": C("weights", 4),
    "num_train_epochs": C("logs", 1.0),
    "max_steps": C("logs", 3),
    "learning_rate": C("weights", 0.01),
    "lr_scheduler_type": C("logs", "linear"),
    "lr_scheduler_kwargs": C("logs", {"power": 3.0}, lr_scheduler_type="polynomial"),
    "warmup_steps": C("logs", 2, lr_scheduler_type="linear"),
    "optim": C("weights", "adamw_torch"),
    "optim_args": C("weights", "momentum=0.9"),
    "optim_target_modules": Elsewhere("test_low_rank_optim.py"),
    "weight_decay": C("weights", 0.5),
    "adam_beta1": C("weights", 0.5, optim="adamw_torch"),
    "adam_beta2": C("weights", 0.5, optim="adamw_torch"),
    "adam_epsilon": C("weights", 0.1, optim="adamw_torch"),
    "gradient_accumulation_steps": C("weights", 2),
    "average_tokens_across_devices": C("rank_sums", False, model="llama"),
    "max_grad_norm": C("weights", 0.01),
    "label_smoothing_factor": C("logs", 0.1, model="llama"),
    "bf16": C("logs", True),
    "fp16": C("logs", True),
    "bf16_full_eval": C("eval", True, use_cpu=True),
    "fp16_full_eval": C("eval", True, use_cpu=True),
    "tf32": R(True, "tf32") if not torch.cuda.is_available() else Elsewhere("test_argument_effects.py"),
    "activation_checkpointing": C("checkpointing", True, model="llama"),
    "activation_checkpointing_kwargs": R({"bogus": 1}, "bogus", model="llama", activation_checkpointing=True),
    "gradient_checkpointing": C("checkpointing", True, model="llama"),
    "gradient_checkpointing_kwargs": R({"bogus": 1}, "bogus", model="llama", gradient_checkpointing=True),
    "torch_compile": C("compile", True),
    "torch_compile_backend": C("compile", "eager"),
    "torch_compile_mode": C("compile", "reduce-overhead"),
    "use_cache": C("use_cache", True, model="llama"),
    "neftune_noise_alpha": C("logs", 5.0, model="llama"),
    "torch_empty_cache_steps": C("empty_cache", 1),
    "auto_find_batch_size": Elsewhere("test_trainer_inputs.py"),
    "logging_strategy": C("logs", "epoch"),
    "logging_steps": C("logs", 2),
    "logging_first_step": C("logs", True, logging_steps=5),
    "log_on_each_node": C("should_log", False, local_rank=1),
    "logging_nan_inf_filter": Elsewhere("test_trainer_steps.py"),
    "include_num_input_tokens_seen": C("logs", "all", model="llama"),
    "log_level": C("log_level", "error"),
    "log_level_replica": C("log_level", "error", local_rank=1),
    "disable_tqdm": C("callbacks", False),
    "report_to": C("callbacks", "jsonl"),
    "run_name": Peer(
        "read only by the reporters that name runs (wandb, mlflow, trackio, ...); tensorboard and "
        "jsonl have no run names, transformers' tensorboard reporter ignores it too"
    ),
    "eval_strategy": C("logs", "steps", eval_steps=2),
    "eval_steps": C("logs", 3, eval_strategy="steps"),
    "eval_delay": C("logs", 3, eval_strategy="steps", eval_steps=1),
    "per_device_eval_batch_size": C("eval_loader", 3),
    "prediction_loss_only": C("predictions", True),
    "eval_on_start": C("logs", True, eval_strategy="steps", eval_steps=10),
    "eval_do_concat_batches": C("predictions", False, per_device_eval_batch_size=2),
    "eval_use_gather_object": Peer(
        "gathers evaluation outputs of several processes as objects: lathe always "
        "does (pickled CPU arrays, evaluation.Gathered), so one process sees no change "
        "(transformers neither)"
    ),
    "eval_accumulation_steps": C("transfers", 2, per_device_eval_batch_size=2),
    "include_for_metrics": C("eval", ["inputs", "loss"]),
    "batch_eval_metrics": C("eval", True, per_device_eval_batch_size=2),
    "save_only_model": C("files", True, **SAVE),
    "save_strategy": C("files", "steps", save_steps=2),
    "save_steps": C("files", 3, save_strategy="steps"),
    "save_on_each_node": C("should_save", True, local_rank=1),
    "save_total_limit": C("files", 1, **SAVE),
    "push_to_hub": R(True, "push_to_hub"),
    "load_best_model_at_end": C("weights", True, **BEST, greater_is_better=True),
    "metric_for_best_model": C("best", "loss", **EVAL, **SAVE),
    "greater_is_better": C("best", True, **BEST),
    "ignore_data_skip": Elsewhere("test_resume.py"),
    "restore_callback_states_from_checkpoint": Elsewhere("test_resume.py"),
    "full_determinism": C("deterministic", True),
    "seed": C("weights", 1),
    "data_seed": C("weights", 7),
    "use_cpu": C("pin_memory", True),
    "dataloader_drop_last": C("loader", True),
    "dataloader_num_workers": C("loader", 1),
    "dataloader_pin_memory": C("pin_memory", False),
    "dataloader_persistent_workers": C("loader", True, **WORKERS),
    "dataloader_prefetch_factor": C("loader", 4, **WORKERS),
    "dataloader_multiprocessing_context": C("loader", "spawn", **WORKERS),
    "dataloader_in_order": C("loader", False, **WORKERS),
    "remove_unused_columns": C("batch_keys", False),
    "label_names": C("label_ids", ["labels", "x"]),
    "train_sampling_strategy": C("weights", "sequential"),
    "length_column_name": C("weights", "size", **LENGTHS, train_sampling_strategy="group_by_length"),
    "ddp_find_unused_parameters": C("ddp", False),
    "ddp_bucket_cap_mb": C("ddp", 10),
    "ddp_broadcast_buffers": C("ddp", False),
    "ddp_static_graph": C("ddp", True),
    "ddp_backend": C("process_group", "mpi"),
    "ddp_timeout": C("process_group", 60),
    "fsdp": Elsewhere("test_fsdp.py"),
    "fsdp_config": Elsewhere("test_fsdp.py"),
    "deepspeed": Elsewhere("test_deepspeed.py"),
    "skip_memory_metrics": C("train_metrics", False),
    "do_train": Peer(SCRIPTS),
    "do_eval": Peer(SCRIPTS),
    "do_predict": Peer(SCRIPTS),
    "resume_from_checkpoint": Peer(SCRIPTS + "; Trainer.train(resume_from_checkpoint=...) is the Trainer's"),
    "local_rank": C("local_rank", 1),
    "past_index": R(1, "past_index"),
    "warmup_ratio": C("logs", 0.5, lr_scheduler_type="linear"),
    "evaluation_strategy": C("logs", "steps", eval_steps=2),
    "group_by_length": C("weights", True, **LENGTHS),
    "logging_dir": C("tensorboard_dir", "tb-logs"),
    "overwrite_output_dir": Warns(True, "overwrite_output_dir"),
    "save_safetensors": Warns(False, "save_safetensors"),
    "no_cuda": C("pin_memory", True),
    "sortish_sampler": Warns(True, "sortish_sampler"),
    "predict_with_generate": Elsewhere("test_seq2seq.py"),
    "generation_max_length": Elsewhere("test_seq2seq.py"),
    "generation_num_beams": Elsewhere("test_args_types.py"),
    "generation_config": Elsewhere("test_trainer_methods.py"),
    # Fields of i17b's args_integrations.py (now lathe/train/args/integrations.py): the Hub ones act only when pushing, which lathe refuses.
    "hub_model_id": Moot("push_to_hub", True),
    "hub_strategy": Moot("push_to_hub", True),
    "hub_token": Moot("push_to_hub", True),
    "hub_private_repo": Moot("push_to_hub", True),
    "hub_always_push": Moot("push_to_hub", True),
    "hub_revision": Moot("push_to_hub", True),
    "debug": Elsewhere("test_args_integrations.py"),
    "accelerator_config": Elsewhere("test_args_integrations.py"),
    "parallelism_config": Elsewhere("test_args_integrations.py"),
    "use_liger_kernel": Elsewhere("test_chunked_loss.py"),  # Liger on CUDA; the chunked loss otherwise, logged
    "chunked_cross_entropy": Elsewhere("test_chunked_loss.py"),
    "chunked_cross_entropy_size": Elsewhere("test_chunked_loss.py"),
    "liger_kernel_config": Elsewhere("test_args_integrations.py"),
    "enable_jit_checkpoint": Elsewhere("test_args_integrations.py"),
    "project": Elsewhere("test_args_integrations.py"),
    "trackio_space_id": Elsewhere("test_args_integrations.py"),
    "trackio_bucket_id": Elsewhere("test_args_integrations.py"),
    "trackio_static_space_id": R("some/space", "trackio_static_space_id"),
}


# ----- the small run each Changes entry observes -----


class Probe(nn.Module):
    """y = w·x + b; casts its inputs to its weights' dtype (as embeddings do) so full fp16/bf16 eval runs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1)

    def forward(self, x, labels=None, **unused_columns):
        prediction = self.linear(x.to(self.linear.weight.dtype)).squeeze(-1)
        if labels is None:
            return {"logits": prediction}
        return {"loss": ((prediction - labels.to(prediction.dtype)) ** 2).mean(), "logits": prediction}


def probe_items(count=12):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(count, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(count, generator=generator)
    # "length" and "size" order the items differently for length grouping; "extra" reaches no forward argument
    return [{"x": x[i], "labels": y[i], "length": i, "size": (i * 7) % count, "extra": 0} for i in range(count)]


def compute_metrics(prediction, compute_result=None):
    return {
        "rows": float(np.asarray(prediction.predictions).shape[0]),
        "has_inputs": float(prediction.inputs is not None),
        "has_losses": float(prediction.losses is not None),
    }


BASE = dict(
    report_to="none",
    disable_tqdm=True,
    save_strategy="no",
    per_device_train_batch_size=2,
    optim="sgd",
    learning_rate=0.1,
    lr_scheduler_type="constant",
    logging_steps=1,
    num_train_epochs=2,
    seed=0,
)
SPEED = re.compile(r"_(runtime|per_second)$")


def make_trainer(output_dir, overrides, model_kind="probe"):
    from lathe import Seq2SeqTrainingArguments, Trainer

    args = Seq2SeqTrainingArguments(**{**BASE, "output_dir": str(output_dir), **overrides})
    if model_kind == "llama":
        return Trainer(
            model=tiny_llama(),
            args=args,
            train_dataset=token_items(8),
            eval_dataset=token_items(4, seed=1),
            data_collator=pad_collate,
        )
    items = probe_items()
    if model_kind == "probe_datasets":  # length_column_name is a column of a datasets.Dataset
        datasets = pytest.importorskip("datasets")
        items = datasets.Dataset.from_list(
            [{k: v.tolist() if torch.is_tensor(v) else v for k, v in i.items()} for i in items]
        )
    return Trainer(
        model=Probe(), args=args, train_dataset=items, eval_dataset=items[:6], compute_metrics=compute_metrics
    )


def _run(trainer):
    trainer.train()
    return trainer


def _eval(trainer):
    return {k: v for k, v in trainer.evaluate().items() if not SPEED.search(k)}


def _loader_facts(loader):
    names = ("batch_size", "drop_last", "num_workers", "persistent_workers", "prefetch_factor", "in_order")
    facts = [getattr(loader, n, None) for n in names] + [getattr(loader.batch_sampler, "drop_last", None)]
    facts.append(type(loader.multiprocessing_context).__name__)
    return facts


def _files(output_dir):
    return sorted(os.path.relpath(os.path.join(d, f), output_dir) for d, _, fs in os.walk(output_dir) for f in fs)


def _calls(monkeypatch, target, name, result=None):
    calls = []

    def record(*args, **kwargs):
        calls.append((args[1:] if args and isinstance(args[0], nn.Module) else args, kwargs))
        return result(*args, **kwargs) if result else None

    monkeypatch.setattr(target, name, record)
    return calls


def _ddp_options(trainer, monkeypatch):
    import torch.nn.parallel

    from lathe.train.parallel import distributed

    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    calls = _calls(monkeypatch, torch.nn.parallel, "DistributedDataParallel")
    distributed.wrap_model(trainer.model, trainer.args)
    return calls[0][1]


def _process_group(trainer, monkeypatch):
    import torch.distributed as dist

    from lathe.train.parallel import distributed

    monkeypatch.setattr(distributed, "launched_world_size", lambda: 2)
    monkeypatch.setattr(distributed, "leave_process_group_at_exit", lambda: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    calls = _calls(monkeypatch, dist, "init_process_group")
    distributed.init_process_group(trainer.args)
    return calls


def _compiled(trainer, monkeypatch):
    calls = _calls(monkeypatch, torch, "compile", result=lambda model, **kwargs: model)
    _run(trainer)
    return calls


def _tensorboard_dir(trainer, monkeypatch):
    from lathe.train.callbacks.reporters.tensorboard import TensorBoardCallback

    writers = []
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = lambda log_dir=None: writers.append(os.path.basename(log_dir)) or types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    TensorBoardCallback()._writer(trainer.args)
    return writers


def _rank_sums(trainer, monkeypatch):
    from lathe.train.parallel import distributed

    calls = _calls(monkeypatch, distributed, "sum_across_ranks", result=lambda value, device: value)
    _run(trainer)
    return len(calls)


def _empty_cache(trainer, monkeypatch):
    from lathe.train import runtime

    calls = _calls(monkeypatch, runtime, "empty_device_cache")
    _run(trainer)
    return len(calls)


def _transfers(trainer, monkeypatch):
    from lathe.train.evaluation import loop as evaluation

    flush = evaluation.Gathered.flush
    calls = []
    monkeypatch.setattr(evaluation.Gathered, "flush", lambda self: calls.append(len(self.on_device)) or flush(self))
    trainer.evaluate()
    return calls


def _deterministic(trainer, monkeypatch):
    enabled = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    return enabled


OBSERVE = {
    "weights": lambda t, mp: [p.detach().clone() for p in _run(t).model.parameters()],
    "logs": lambda t, mp: [{k: v for k, v in log.items() if not SPEED.search(k)} for log in _run(t).state.log_history],
    "files": lambda t, mp: _files(_run(t).args.output_dir),
    "folders": lambda t, mp: sorted(os.listdir(os.path.dirname(_run(t).args.output_dir))),
    "eval": lambda t, mp: _eval(t),
    "train_metrics": lambda t, mp: sorted(t.train().metrics),
    "predictions": lambda t, mp: t.predict(probe_items()[:6]).predictions,
    "label_ids": lambda t, mp: t.predict(probe_items()[:6]).label_ids,
    "best": lambda t, mp: (_run(t).state.best_metric, t.state.best_model_checkpoint),
    "loader": lambda t, mp: _loader_facts(t.get_train_dataloader()),
    "eval_loader": lambda t, mp: len(next(iter(t.get_eval_dataloader()))["x"]),
    "batch_keys": lambda t, mp: sorted(next(iter(t.get_train_dataloader()))),
    "pin_memory": lambda t, mp: t.args.dataloader_pin_memory,
    "checkpointing": lambda t, mp: _run(t).model.is_gradient_checkpointing,
    "use_cache": lambda t, mp: t.model.config.use_cache,
    "callbacks": lambda t, mp: [type(c).__name__ for c in t.callback_handler.callbacks],
    "should_log": lambda t, mp: t.args.should_log,
    "should_save": lambda t, mp: t.args.should_save,
    "log_level": lambda t, mp: t.args.get_process_log_level(),
    "local_rank": lambda t, mp: t.args.local_process_index,
    "ddp": _ddp_options,
    "process_group": _process_group,
    "compile": _compiled,
    "tensorboard_dir": _tensorboard_dir,
    "rank_sums": _rank_sums,
    "empty_cache": _empty_cache,
    "transfers": _transfers,
    "deterministic": _deterministic,
}


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a) and torch.is_tensor(b):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _field_names():
    from lathe import Seq2SeqTrainingArguments

    return [f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)]


def test_every_field_has_an_entry():
    names = _field_names()
    missing = [name for name in names if name not in FIELDS]
    stale = [name for name in FIELDS if name not in names]
    assert not missing, f"TrainingArguments fields with no entry saying how they are observed: {missing}"
    assert not stale, f"entries for fields TrainingArguments no longer has: {stale}"


def _entries(kind):
    return [pytest.param(name, entry, id=name) for name, entry in FIELDS.items() if isinstance(entry, kind)]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "entry"), _entries(Changes))
def test_field_changes_what_a_run_does(tmp_path, monkeypatch, name, entry):
    context = dict(entry.context)
    model_kind = context.pop("model", "probe")
    observe = OBSERVE[entry.observe]
    with monkeypatch.context() as patches:
        default = observe(make_trainer(tmp_path / "default", context, model_kind), patches)
    changed_context = {**context, name: entry.value}
    if name == "output_dir":
        changed_context[name] = str(tmp_path / entry.value)
    with monkeypatch.context() as patches:
        changed = observe(make_trainer(tmp_path / "changed", changed_context, model_kind), patches)
    assert not _same(default, changed), f"{name}={entry.value!r} changed nothing that {entry.observe!r} sees"


@pytest.mark.parametrize(("name", "entry"), _entries(Raises))
def test_field_is_refused_with_its_name(tmp_path, name, entry):
    context = dict(entry.context)
    model_kind = context.pop("model", "probe")
    with pytest.raises((ValueError, TypeError, NotImplementedError, RuntimeError), match=entry.match):
        make_trainer(tmp_path, {**context, name: entry.value}, model_kind).train()


@pytest.mark.parametrize(("name", "entry"), _entries(Warns))
def test_field_warns_it_does_nothing(tmp_path, name, entry):
    with pytest.warns(Warning, match=entry.match):
        make_trainer(tmp_path, {name: entry.value})


@pytest.mark.parametrize(("name", "entry"), _entries(Elsewhere))
def test_field_is_set_by_the_named_test(name, entry):
    with open(os.path.join(TESTS, entry.test_file), encoding="utf-8") as f:
        assert re.search(rf"\b{name}\s*=", f.read()), f"{entry.test_file} never sets {name}"


MOOT_VALUES = {"hub_strategy": "end", "hub_private_repo": True, "hub_always_push": True}


@pytest.mark.parametrize(("name", "entry"), _entries(Moot))
def test_field_acts_only_with_a_refused_one(tmp_path, name, entry):
    assert isinstance(FIELDS[entry.needs], Raises) and FIELDS[entry.needs].value == entry.value
    with pytest.raises(ValueError, match=entry.needs):
        make_trainer(tmp_path, {name: MOOT_VALUES.get(name, "x"), entry.needs: entry.value})


@pytest.mark.hf
@pytest.mark.parametrize(("name", "entry"), _entries(Peer))
def test_transformers_trainer_does_not_read_it_either(name, entry):
    import transformers

    folder = os.path.dirname(transformers.__file__)
    sources = ["trainer.py", "trainer_callback.py", "trainer_seq2seq.py", "trainer_pt_utils.py"]
    readers = [s for s in sources if re.search(rf"args\.{name}\b", open(os.path.join(folder, s)).read())]
    if name == "eval_use_gather_object":
        readers.remove("trainer.py")  # read for several processes only; lathe always gathers objects there
    assert not readers, f"transformers reads args.{name} in {readers}: lathe must act on it too"
