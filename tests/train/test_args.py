"""TrainingArguments: transformers' defaults, validation errors, deprecated names, derived values."""

import dataclasses
import json
import subprocess
import sys
import warnings

import pytest

from lathe.train.args.training_args import (
    IntervalStrategy,
    OptimizerNames,
    SaveStrategy,
    SchedulerType,
    Seq2SeqTrainingArguments,
    TrainingArguments,
    default_logging_dir,
)


def make(**kwargs) -> TrainingArguments:
    """Build arguments and fail on any warning (deprecation warnings are tested explicitly)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return TrainingArguments(**kwargs)


# --- Enums ---


def test_enums_compare_equal_to_their_strings():
    args = make(eval_strategy="steps", save_strategy="best", metric_for_best_model="loss")
    assert args.eval_strategy == "steps" and args.eval_strategy is IntervalStrategy.STEPS
    assert args.save_strategy == "best" and isinstance(args.save_strategy, SaveStrategy)
    assert args.lr_scheduler_type == SchedulerType.LINEAR == "linear"
    assert args.optim == OptimizerNames.ADAMW_TORCH_FUSED == "adamw_torch_fused"
    assert str(args.eval_strategy) == "steps" and f"{args.eval_strategy}" == "steps"
    assert {"steps": 1}[args.eval_strategy] == 1  # same hash as the string


def test_scheduler_and_optimizer_names_cover_the_required_values():
    for name in (
        "linear",
        "cosine",
        "cosine_with_restarts",
        "polynomial",
        "constant",
        "constant_with_warmup",
        "inverse_sqrt",
        "reduce_lr_on_plateau",
        "cosine_with_min_lr",
        "cosine_warmup_with_min_lr",
        "warmup_stable_decay",
    ):
        assert SchedulerType(name) == name
    for name in ("adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop", "adafactor"):
        assert OptimizerNames(name) == name


@pytest.mark.parametrize(
    "name, value",
    [
        ("eval_strategy", "sometimes"),
        ("logging_strategy", "best"),
        ("save_strategy", "always"),
        ("lr_scheduler_type", "cosin"),
        ("optim", "adam"),
    ],
)
def test_bad_enum_value_names_field_and_lists_allowed_values(name, value):
    with pytest.raises(ValueError) as error:
        make(**{name: value})
    message = str(error.value)
    assert name in message and repr(value) in message
    assert "'steps'" in message or "'linear'" in message or "'adamw_torch'" in message


# --- Defaults ---


def test_defaults_that_depend_on_post_init():
    args = make()
    assert args.output_dir == "trainer_output"
    assert args.report_to == []
    assert args.optim == "adamw_torch_fused"
    assert args.eval_steps is None and args.eval_strategy == "no" and args.do_eval is False
    assert args.metric_for_best_model is None and args.greater_is_better is None
    assert args.activation_checkpointing is False and args.gradient_checkpointing is False
    assert args.include_num_input_tokens_seen == "no"
    assert args.warmup_steps == 0 and args.logging_steps == 500 and args.save_steps == 500
    assert args.average_tokens_across_devices is True and args.ddp_timeout == 1800
    assert args.disable_tqdm is False and args.push_to_hub is False
    assert args.train_sampling_strategy == "random"


def test_output_dir_is_positional_and_user_expanded():
    assert TrainingArguments("~/run").output_dir.startswith("/") or sys.platform == "win32"
    assert TrainingArguments("run").output_dir == "run"


def test_every_field_has_a_help_sentence():
    for cls in (TrainingArguments, Seq2SeqTrainingArguments):
        for f in dataclasses.fields(cls):
            text = f.metadata.get("help", "")
            assert len(text.split()) >= 3 and text.rstrip().endswith("."), f.name


DEPRECATED = (
    "warmup_ratio",
    "evaluation_strategy",
    "group_by_length",
    "logging_dir",
    "overwrite_output_dir",
    "save_safetensors",
    "no_cuda",
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
)


def test_deprecated_fields_are_marked_and_default_to_none():
    by_name = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    for name in DEPRECATED:
        assert "deprecated" in by_name[name].metadata, name
        assert by_name[name].default is None, name
    assert by_name["warmup_ratio"].metadata["deprecated"] == "warmup_steps"
    assert by_name["evaluation_strategy"].metadata["deprecated"] == "eval_strategy"
    assert by_name["no_cuda"].metadata["deprecated"] == "use_cpu"


def _shared_field_values(ours, theirs) -> dict:
    shared = {f.name for f in dataclasses.fields(ours)} & {f.name for f in dataclasses.fields(theirs)}
    ours_dict, theirs_dict = ours.to_dict(), theirs.to_dict()
    return {name: (ours_dict[name], theirs_dict[name]) for name in sorted(shared)}


@pytest.mark.hf
def test_every_shared_default_equals_transformers():
    transformers = pytest.importorskip("transformers")
    ours_fields = {f.name: f for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    theirs_fields = {f.name: f for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    shared = sorted(ours_fields.keys() & theirs_fields.keys())
    assert len(shared) > 90

    def declared(f):
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()

    for name in shared:
        assert declared(ours_fields[name]) == declared(theirs_fields[name]), name
    # And after __post_init__ (output_dir, report_to, eval_steps, optim, checkpointing aliases ...).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.Seq2SeqTrainingArguments()
    for name, (ours_value, theirs_value) in _shared_field_values(Seq2SeqTrainingArguments(), theirs).items():
        assert ours_value == theirs_value, name


@pytest.mark.hf
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(eval_strategy="steps", logging_steps=10.0),
        dict(eval_strategy="steps", eval_steps=0, logging_steps=7, save_steps=14.0, load_best_model_at_end=True),
        dict(
            eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True, metric_for_best_model="accuracy"
        ),
        dict(eval_strategy="steps", save_strategy="best", metric_for_best_model="eval_loss"),
        dict(lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="epoch"),
        dict(include_num_input_tokens_seen=True, torch_compile_mode="default", use_cpu=True),
        dict(lr_scheduler_kwargs='{"num_cycles": "2", "power": "1.5", "flag": "true"}', warmup_steps=0.25),
        dict(activation_checkpointing_kwargs={"use_reentrant": False}, gradient_checkpointing=True),
    ],
)
def test_derived_values_equal_transformers(kwargs):
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.TrainingArguments(**kwargs)
        ours = TrainingArguments(**kwargs)
    for name, (ours_value, theirs_value) in _shared_field_values(ours, theirs).items():
        assert ours_value == theirs_value, name


# --- Deprecated transformers 4 names ---


@pytest.mark.parametrize(
    "old, value, new, expected",
    [
        ("warmup_ratio", 0.1, "warmup_steps", 0.1),
        ("evaluation_strategy", "epoch", "eval_strategy", "epoch"),
        ("evaluation_strategy", False, "eval_strategy", "no"),
        ("group_by_length", True, "train_sampling_strategy", "group_by_length"),
        ("no_cuda", True, "use_cpu", True),
    ],
)
def test_deprecated_name_maps_to_new_field_with_future_warning(old, value, new, expected):
    with pytest.warns(FutureWarning, match=f"`{old}`.*`{new}`"):
        args = TrainingArguments(**{old: value})
    assert getattr(args, new) == expected
    assert getattr(args, old) is None  # reset, so copies neither warn again nor conflict
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dataclasses.replace(args) == args


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(warmup_ratio=0.1, warmup_steps=10),
        dict(evaluation_strategy="steps", eval_strategy="epoch"),
        dict(no_cuda=False, use_cpu=True),
        dict(group_by_length=True, train_sampling_strategy="sequential"),
        dict(group_by_length=False, train_sampling_strategy="group_by_length"),
    ],
)
def test_old_and_new_name_disagreeing_is_an_error(kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="disagree|contradicts"):
            TrainingArguments(**kwargs)


def test_old_and_new_name_agreeing_is_accepted():
    with pytest.warns(FutureWarning):
        args = TrainingArguments(warmup_ratio=0.2, warmup_steps=0.2, no_cuda=True, use_cpu=True)
    assert args.warmup_steps == 0.2 and args.use_cpu


def test_warmup_ratio_must_be_a_fraction():
    with pytest.raises(ValueError, match="warmup_ratio"):
        TrainingArguments(warmup_ratio=1.5)


def test_ignored_deprecated_names_warn_and_reset():
    with pytest.warns(FutureWarning, match="overwrite_output_dir"):
        args = TrainingArguments(overwrite_output_dir=True)
    assert args.overwrite_output_dir is None
    with pytest.warns(FutureWarning, match="save_safetensors=False. is ignored"):
        args = TrainingArguments(save_safetensors=False)
    assert args.save_safetensors is None


def test_logging_dir_is_kept_for_the_tensorboard_reporter(tmp_path):
    with pytest.warns(FutureWarning, match="logging_dir"):
        args = TrainingArguments(output_dir=str(tmp_path), logging_dir=str(tmp_path / "tb"))
    assert args.logging_dir == str(tmp_path / "tb")
    assert make().logging_dir is None  # computed by the reporter only when it is used
    default = default_logging_dir("out")
    assert default.startswith("out/runs/") and "_" in default.rsplit("/", 1)[1]


def test_gradient_checkpointing_is_an_alias_of_activation_checkpointing():
    with pytest.warns(FutureWarning, match="activation_checkpointing"):
        args = TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False})
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}
    # A copy that changes the new name wins over the mirrored old one.
    copy = dataclasses.replace(args, activation_checkpointing=False)
    assert copy.activation_checkpointing is False and copy.gradient_checkpointing is False


# --- Validation ---


@pytest.mark.parametrize(
    "kwargs, field_name",
    [
        (dict(fp16=True, bf16=True), "bf16"),
        (dict(fp16_full_eval=True, bf16_full_eval=True), "bf16_full_eval"),
        (dict(logging_steps=10.5), "logging_steps"),
        (dict(eval_strategy="steps", eval_steps=2.5), "eval_steps"),
        (dict(save_steps=100.5), "save_steps"),
        (dict(logging_steps=0), "logging_steps"),
        (dict(save_steps=-5), "save_steps"),
        (dict(eval_strategy="steps", eval_steps=0, logging_strategy="no", logging_steps=0), "eval_steps"),
        (dict(gradient_accumulation_steps=0), "gradient_accumulation_steps"),
        (dict(per_device_train_batch_size=0), "per_device_train_batch_size"),
        (dict(learning_rate=-1e-3), "learning_rate"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(warmup_steps=2.5), "warmup_steps"),
        (dict(max_steps=0), "max_steps"),
        (dict(max_steps=-2), "max_steps"),
        (dict(num_train_epochs=-1), "num_train_epochs"),
        (dict(load_best_model_at_end=True, eval_strategy="epoch", save_strategy="steps"), "save_strategy"),
        (dict(load_best_model_at_end=True, eval_strategy="no"), "eval_strategy"),
        (dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=30, save_steps=50), "save_steps"),
        (dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=50), "save_steps"),
        (dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=0.25), "save_steps"),
        (dict(save_strategy="best"), "metric_for_best_model"),
        (dict(lr_scheduler_type="reduce_lr_on_plateau"), "eval_strategy"),
        (dict(lr_scheduler_type="greedy"), "eval_strategy"),
        (dict(report_to="comet_ml"), "report_to"),
        (dict(report_to=["jsonl", "neptune"]), "report_to"),
        (dict(include_num_input_tokens_seen="some"), "include_num_input_tokens_seen"),
        (dict(train_sampling_strategy="shuffled"), "train_sampling_strategy"),
        (dict(log_level="loud"), "log_level"),
        (dict(ddp_backend="tcp"), "ddp_backend"),
        (dict(dataloader_multiprocessing_context="thread"), "dataloader_multiprocessing_context"),
        (dict(dataloader_prefetch_factor=2), "dataloader_prefetch_factor"),
        (dict(include_for_metrics=["inputs", "logits"]), "include_for_metrics"),
        (dict(lr_scheduler_kwargs="num_cycles=2"), "lr_scheduler_kwargs"),
        (dict(lr_scheduler_kwargs="{num_cycles: 2}"), "lr_scheduler_kwargs"),
        (dict(torch_empty_cache_steps=0), "torch_empty_cache_steps"),
        (dict(torch_empty_cache_steps=1.0), "torch_empty_cache_steps"),
        (dict(fsdp="full_shard sideways"), "fsdp"),
        (dict(push_to_hub=True), "push_to_hub"),
    ],
)
def test_invalid_settings_raise_naming_the_field(kwargs, field_name):
    with pytest.raises(ValueError) as error:
        make(**kwargs)
    assert field_name in str(error.value)


def test_push_to_hub_error_says_lathe_is_offline():
    with pytest.raises(ValueError, match="not supported: lathe works offline"):
        make(push_to_hub=True)


def test_whole_float_steps_become_ints_and_fractions_stay():
    args = make(logging_steps=10.0, save_steps=20.0, eval_strategy="steps", eval_steps=5.0, warmup_steps=3.0)
    assert (args.logging_steps, args.save_steps, args.eval_steps, args.warmup_steps) == (10, 20, 5, 3)
    assert all(type(v) is int for v in (args.logging_steps, args.save_steps, args.eval_steps, args.warmup_steps))
    args = make(logging_steps=0.05, save_steps=0.2, eval_strategy="steps", eval_steps=0.1, warmup_steps=0.3)
    assert (args.logging_steps, args.save_steps, args.eval_steps, args.warmup_steps) == (0.05, 0.2, 0.1, 0.3)


def test_eval_steps_defaults_to_logging_steps():
    assert make(eval_strategy="steps", logging_steps=25).eval_steps == 25
    assert make(eval_strategy="steps", eval_steps=0, logging_steps=25).eval_steps == 25
    assert make(eval_strategy="steps", eval_steps=40, logging_steps=25).eval_steps == 40
    assert make(eval_strategy="epoch").eval_steps is None


def test_eval_strategy_sets_do_eval():
    assert make(eval_strategy="epoch").do_eval is True
    assert make(do_eval=True).do_eval is True


def test_yaml_false_means_no_for_strategies():
    args = make(eval_strategy=False, save_strategy=False, logging_strategy=False)
    assert args.eval_strategy == args.save_strategy == args.logging_strategy == "no"


def test_best_model_strategies_that_are_accepted():
    args = make(load_best_model_at_end=True, eval_strategy="steps", eval_steps=10, save_steps=30)
    assert args.save_steps == 30
    make(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=0.3)
    make(load_best_model_at_end=True, eval_strategy="epoch", save_strategy="best")
    make(save_strategy="best", metric_for_best_model="accuracy", eval_strategy="epoch")


@pytest.mark.parametrize(
    "kwargs, metric, greater",
    [
        (dict(load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch"), "loss", False),
        (dict(metric_for_best_model="eval_loss"), "eval_loss", False),
        (dict(metric_for_best_model="accuracy"), "accuracy", True),
        (dict(metric_for_best_model="eval_f1"), "eval_f1", True),
        (dict(metric_for_best_model="eval_loss", greater_is_better=True), "eval_loss", True),
        (dict(lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="epoch"), "loss", False),
        (dict(), None, None),
    ],
)
def test_metric_for_best_model_and_greater_is_better(kwargs, metric, greater):
    args = make(**kwargs)
    assert args.metric_for_best_model == metric
    assert args.greater_is_better is greater


@pytest.mark.parametrize(
    "value, expected",
    [
        ("none", []),
        (None, []),
        (["none"], []),
        ("tensorboard", ["tensorboard"]),
        (["jsonl", "tensorboard"], ["jsonl", "tensorboard"]),
    ],
)
def test_report_to_is_normalised_to_a_list(value, expected):
    assert make(report_to=value).report_to == expected


def test_report_to_all_lists_installed_reporters(monkeypatch):
    import importlib.util

    installed = {"mlflow", "wandb"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in installed else None)
    assert make(report_to="all").report_to == ["mlflow", "wandb"]  # transformers' order; jsonl is lathe's own
    installed.update({"tensorboard", "trackio"})
    assert make(report_to=["all"]).report_to == ["mlflow", "tensorboard", "wandb", "trackio"]
    monkeypatch.setenv("DISABLE_MLFLOW_INTEGRATION", "true")
    assert make(report_to="all").report_to == ["tensorboard", "wandb", "trackio"]


@pytest.mark.hf
def test_report_to_all_equals_transformers_among_supported():
    transformers = pytest.importorskip("transformers")
    theirs = transformers.TrainingArguments(output_dir="o", report_to="all").report_to
    from lathe.train.callbacks.reporters import REPORTERS

    assert make(report_to="all").report_to == [name for name in theirs if name in REPORTERS]


@pytest.mark.parametrize("value, expected", [(True, "all"), (False, "no"), ("non_padding", "non_padding")])
def test_include_num_input_tokens_seen_accepts_bools(value, expected):
    assert make(include_num_input_tokens_seen=value).include_num_input_tokens_seen == expected


def test_json_dict_fields_are_parsed_with_typed_values():
    args = make(lr_scheduler_kwargs='{"num_cycles": "2", "min_lr": "0.1", "flag": "false", "name": "x"}')
    assert args.lr_scheduler_kwargs == {"num_cycles": 2, "min_lr": 0.1, "flag": False, "name": "x"}
    args = make(fsdp_config="configs/fsdp.json", activation_checkpointing_kwargs='{"use_reentrant": false}')
    assert args.fsdp_config == "configs/fsdp.json"  # a file path, read by the FSDP set-up later
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}
    assert make(lr_scheduler_kwargs={"power": 2}).lr_scheduler_kwargs == {"power": 2}


def test_torch_compile_options_imply_torch_compile():
    args = make(torch_compile_mode="reduce-overhead")
    assert args.torch_compile and args.torch_compile_backend == "inductor"
    assert make().torch_compile_backend is None


def test_use_cpu_turns_off_pin_memory():
    assert make(use_cpu=True).dataloader_pin_memory is False
    assert make().dataloader_pin_memory is True


# --- Derived values ---


def test_get_warmup_steps():
    assert make(warmup_steps=10).get_warmup_steps(1000) == 10
    assert make(warmup_steps=0.1).get_warmup_steps(95) == 10  # ceil(9.5)
    assert make(warmup_steps=0).get_warmup_steps(95) == 0


def test_single_process_ranks_and_batch_sizes():
    args = make(per_device_train_batch_size=4, per_device_eval_batch_size=16)
    assert (args.world_size, args.process_index, args.local_process_index) == (1, 0, 0)
    assert args.should_log and args.should_save
    assert (args.train_batch_size, args.eval_batch_size) == (4, 16)
    assert args.ddp_timeout_delta.total_seconds() == 1800
    entered = []
    with args.main_process_first(desc="tokenizing"):
        entered.append(True)
    assert entered == [True]


def test_local_rank_from_a_launcher_decides_the_local_process():
    args = make(local_rank=1, log_on_each_node=True)
    assert args.local_process_index == 1 and not args.should_log


def test_device():
    import torch

    args = make(use_cpu=True)
    assert args.device == torch.device("cpu") and args.n_gpu == 0
    default = make().device
    if torch.cuda.is_available():
        assert default == torch.device("cuda", 0)
    elif not torch.backends.mps.is_available():
        assert default == torch.device("cpu")


def test_importing_args_does_not_import_torch():
    code = "import sys, lathe.train.args.training_args; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- Serialisation ---


def test_to_dict_round_trips_through_json():
    args = make(
        eval_strategy="steps",
        eval_steps=50,
        save_strategy="best",
        metric_for_best_model="accuracy",
        lr_scheduler_type="cosine",
        lr_scheduler_kwargs={"num_cycles": 0.5},
        report_to="jsonl",
        label_names=["labels"],
        warmup_steps=0.1,
        include_num_input_tokens_seen=True,
    )
    d = args.to_dict()
    assert d["eval_strategy"] == "steps" and type(d["eval_strategy"]) is str
    assert type(d["optim"]) is str and type(d["lr_scheduler_type"]) is str
    assert d["hub_token"] == "<HUB_TOKEN>"  # secrets are masked, as transformers masks them
    saved = {key: value for key, value in json.loads(args.to_json_string()).items() if key != "hub_token"}
    rebuilt = make(**saved)
    assert rebuilt == args
    assert rebuilt.to_dict() == d


def test_to_sanitized_dict_has_only_scalars():
    d = make(label_names=["labels"]).to_sanitized_dict()
    assert d["train_batch_size"] == 8 and d["eval_batch_size"] == 8
    assert d["label_names"] == "['labels']" and d["report_to"] == "[]"
    assert all(type(v) in (bool, int, float, str) for v in d.values())


def test_str_lists_fields_sorted():
    text = str(make())
    assert text.startswith("TrainingArguments(\n")
    names = [line.split("=", 1)[0] for line in text.splitlines()[1:-1]]
    assert names == sorted(names) and "eval_strategy=no," in text
    assert repr(make()) == text


# --- Fluent setters ---


def test_fluent_setters_match_transformers_examples():
    args = make().set_training(learning_rate=1e-4, batch_size=32)
    assert args.learning_rate == 1e-4 and args.per_device_train_batch_size == 32 and args.do_train
    args = make().set_evaluate(strategy="steps", steps=100)
    assert args.eval_steps == 100 and args.eval_strategy == "steps" and args.do_eval and args.eval_delay == 0
    args = make().set_testing(batch_size=32)
    assert args.per_device_eval_batch_size == 32 and args.do_predict
    assert make().set_save(strategy="steps", steps=100).save_steps == 100
    args = make().set_logging(strategy="steps", steps=100, report_to="tensorboard")
    assert args.logging_steps == 100 and args.report_to == ["tensorboard"]
    args = make().set_optimizer(name="adamw_torch", beta1=0.8)
    assert args.optim == "adamw_torch" and args.adam_beta1 == 0.8
    args = make().set_lr_scheduler(name="cosine", warmup_steps=0.05)
    assert args.lr_scheduler_type == "cosine" and args.warmup_steps == 0.05
    args = make().set_dataloader(train_batch_size=16, eval_batch_size=64, sampler_seed=7)
    assert (args.per_device_train_batch_size, args.per_device_eval_batch_size, args.data_seed) == (16, 64, 7)


def test_setters_validate_what_they_set():
    with pytest.raises(ValueError, match="eval_strategy"):
        make().set_evaluate(strategy="hourly")
    with pytest.raises(ValueError, match="steps"):
        make().set_save(strategy="steps", steps=0)
    with pytest.raises(ValueError, match="optim"):
        make().set_optimizer(name="adamw_apex_fused")
    with pytest.raises(ValueError, match="report_to"):
        make().set_logging(report_to="comet_ml")
    with pytest.warns(FutureWarning, match="activation_checkpointing"):
        args = make().set_training(gradient_checkpointing=True)
    assert args.activation_checkpointing and args.gradient_checkpointing


# --- Seq2Seq ---


def test_seq2seq_arguments():
    class FakeGenerationConfig:
        def to_dict(self):
            return {"max_new_tokens": 8}

    args = Seq2SeqTrainingArguments(predict_with_generate=True, generation_num_beams=2)
    assert (args.sortish_sampler, args.generation_max_length, args.generation_config) == (False, None, None)
    assert args.predict_with_generate and args.generation_num_beams == 2
    assert args.eval_strategy == "no"  # the parent's __post_init__ ran
    args.generation_config = FakeGenerationConfig()
    assert json.loads(args.to_json_string())["generation_config"] == {"max_new_tokens": 8}


def _two_rank_worker(rank: int, init_file: str, marker: str, results: str):
    import os
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        args = TrainingArguments(output_dir=os.path.dirname(marker), use_cpu=True)
        with args.main_process_first(desc="writing the marker"):
            if rank == 0:
                time.sleep(0.5)  # a replica that did not wait would find no marker
                open(marker, "w").close()
            seen = os.path.exists(marker)
        line = f"{rank} {args.world_size} {args.process_index} {args.should_save} {seen}\n"
        with open(f"{results}.{rank}", "w") as handle:
            handle.write(line)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_main_process_first_makes_replicas_wait(tmp_path):
    import torch.multiprocessing as mp

    marker, results = str(tmp_path / "marker"), str(tmp_path / "result")
    mp.spawn(_two_rank_worker, args=(str(tmp_path / "init"), marker, results), nprocs=2, join=True)
    lines = sorted(open(f"{results}.{rank}").read().split() for rank in (0, 1))
    assert lines == [["0", "2", "0", "True", "True"], ["1", "2", "1", "False", "True"]]
