"""parse_train_config: LLaMA-Factory names and defaults, precedence, and kind errors."""

import pytest

from lathe.llm.config.train import parse_overrides, parse_train_config

BASE = {"model_name_or_path": "some/folder", "dataset": "demo", "output_dir": "out"}


def test_llamafactory_defaults():
    config = parse_train_config(BASE)
    assert config.finetuning.stage == "sft"
    assert config.finetuning.finetuning_type == "lora"
    assert config.finetuning.lora_rank == 8
    assert config.finetuning.lora_alpha == 16  # 2 x rank
    assert config.finetuning.lora_dropout == 0.0
    assert config.finetuning.lora_target == ["all"]
    assert config.finetuning.freeze_trainable_layers == 2
    assert config.model.trust_remote_code is False
    assert config.data.cutoff_len == 2048
    assert config.data.dataset_dir == "data"
    assert config.data.dataset == ["demo"]
    assert config.data.packing is False  # sft
    assert config.generating.temperature == 0.95
    assert config.training.do_train is True  # lathe train trains even when the file omits do_train
    assert config.training.generation_max_length == 2048  # LLaMA-Factory: cutoff_len


def test_packing_defaults_to_true_for_pt():
    assert parse_train_config({**BASE, "stage": "pt"}).data.packing is True
    assert parse_train_config({**BASE, "stage": "pt", "packing": False}).data.packing is False


def test_precedence_defaults_file_overrides(tmp_path, write_yaml):
    path = write_yaml(tmp_path / "c.yaml", {**BASE, "lora_rank": 4, "learning_rate": 0.01, "num_train_epochs": 2})
    config = parse_train_config(path, ["lora_rank=32", "--learning_rate", "2e-4"])
    assert config.finetuning.lora_rank == 32 and config.finetuning.lora_alpha == 64
    assert config.training.learning_rate == pytest.approx(2e-4)
    assert config.training.num_train_epochs == 2  # from the file
    assert config.training.weight_decay == 0.0  # the default


def test_override_forms():
    assert parse_overrides(["a=1", "--b", "2", "--c=3", "--d", "--e", "x"]) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "true",
        "e": "x",
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["oops"])


def test_yaml_scientific_notation_is_a_number(tmp_path):
    # PyYAML (YAML 1.1) reads 1e-3 and 5e-5 as strings.
    path = tmp_path / "c.yaml"
    path.write_text("model_name_or_path: m\ndataset: d\nlearning_rate: 1e-3\nweight_decay: 1e-2\n")
    config = parse_train_config(str(path))
    assert config.training.learning_rate == pytest.approx(1e-3)
    assert isinstance(config.training.weight_decay, float)


def test_yaml_unquoted_no_is_the_no_strategy(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model_name_or_path: m\ndataset: d\neval_strategy: no\nsave_strategy: no\n")
    config = parse_train_config(str(path))
    assert str(config.training.eval_strategy.value) == "no"
    assert str(config.training.save_strategy.value) == "no"


def test_unknown_key_suggests_the_closest(tmp_path, write_yaml):
    path = write_yaml(tmp_path / "c.yaml", {**BASE, "lora_rnak": 4})
    with pytest.raises(ValueError, match=r"Unknown key 'lora_rnak' \(in .*c.yaml\); did you mean 'lora_rank'"):
        parse_train_config(path)
    with pytest.raises(ValueError, match=r"'learnig_rate' \(command line\); did you mean 'learning_rate'"):
        parse_train_config(BASE, ["learnig_rate=1"])


def test_unsupported_llamafactory_keys_say_so():
    with pytest.raises(
        ValueError,
        match="infer_backend .* LLaMA-Factory key for inference engines .*, which lathe does not support yet",
    ):
        parse_train_config({**BASE, "infer_backend": "vllm"})
    with pytest.raises(ValueError, match="use_mca: a Megatron-Core key .*use FSDP2 .* or DeepSpeed"):
        parse_train_config({**BASE, "use_mca": True})
    # LLaMA-Factory's own default changes nothing, so it is accepted.
    parse_train_config({**BASE, "media_dir": None, "flash_attn": "auto", "use_unsloth": False})


def test_ppo_is_not_supported_yet():
    with pytest.raises(ValueError, match="stage 'ppo' is not supported yet; lathe trains pt, sft, rm, dpo, kto"):
        parse_train_config({**BASE, "stage": "ppo"})
    for stage in ("rm", "dpo", "kto"):
        assert parse_train_config({**BASE, "stage": stage}).finetuning.stage == stage


def test_bad_values_name_the_key():
    with pytest.raises(ValueError, match="lora_rank: expected a number, got 'big'"):
        parse_train_config({**BASE, "lora_rank": "big"})
    with pytest.raises(ValueError, match=r"finetuning_type: expected one of .*got 'qlora'"):
        parse_train_config({**BASE, "finetuning_type": "qlora"})
    with pytest.raises(ValueError, match="flash_attn: expected one of"):
        parse_train_config({**BASE, "flash_attn": "fast"})
    with pytest.raises(ValueError, match="model_name_or_path is required"):
        parse_train_config({"dataset": "d"})
    with pytest.raises(ValueError, match="dataset .*required for training"):
        parse_train_config({"model_name_or_path": "m"})


def test_cross_section_checks():
    with pytest.raises(ValueError, match="needs predict_with_generate"):
        parse_train_config({**BASE, "do_predict": True, "val_size": 0.1})
    with pytest.raises(ValueError, match="set eval_dataset, or val_size"):
        parse_train_config({**BASE, "do_eval": True})
    with pytest.raises(ValueError, match="only applies to stage sft"):
        parse_train_config({**BASE, "stage": "pt", "neat_packing": True})
    with pytest.raises(ValueError, match="adapter_name_or_path .*needs finetuning_type: lora"):
        parse_train_config({**BASE, "finetuning_type": "full", "adapter_name_or_path": "a"})
    with pytest.raises(ValueError, match="mask_history and train_on_prompt"):
        parse_train_config({**BASE, "mask_history": True, "train_on_prompt": True})


def test_comma_lists_and_derived_values():
    config = parse_train_config(
        {
            **BASE,
            "dataset": "a, b",
            "lora_target": "q_proj,v_proj",
            "freeze_extra_modules": "embed_tokens",
            "adapter_name_or_path": "x,y",
            "neat_packing": True,
            "bf16": False,
            "val_size": 100,
        }
    )
    assert config.data.dataset == ["a", "b"]
    assert config.finetuning.lora_target == ["q_proj", "v_proj"]
    assert config.finetuning.freeze_extra_modules == ["embed_tokens"]
    assert config.model.adapter_name_or_path == ["x", "y"]
    assert config.data.packing is True and config.model.block_diag_attn is True
    assert config.data.val_size == 100 and isinstance(config.data.val_size, int)
    assert config.model.compute_dtype is None


def test_command_line_strings_take_the_field_type():
    config = parse_train_config(BASE, ["max_samples=10", "val_size=0.25", "plot_loss=true", "template=null"])
    assert config.data.max_samples == 10
    assert config.data.val_size == 0.25
    assert config.finetuning.plot_loss is True
    assert config.data.template is None


def test_overwrite_output_dir_is_kept_for_the_workflow():
    assert parse_train_config({**BASE, "overwrite_output_dir": True}).training.overwrite_output_dir is True
    assert parse_train_config(BASE).training.overwrite_output_dir is False


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        parse_train_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        parse_train_config(str(bad))


def test_to_dict_is_json_friendly():
    import json

    json.dumps(parse_train_config(BASE).to_dict())


def test_early_stopping_watches_eval_loss_and_needs_evaluation():
    config = parse_train_config(
        {**BASE, "early_stopping_steps": 2, "val_size": 0.1, "eval_strategy": "steps", "eval_steps": 5}
    )
    assert config.training.metric_for_best_model == "eval_loss" and config.training.greater_is_better is False
    with pytest.raises(ValueError, match="early_stopping_steps .*counts evaluations"):
        parse_train_config({**BASE, "early_stopping_steps": 2})


def test_generation_kwargs_leave_out_sampling_settings_when_greedy():
    sampling = parse_train_config({**BASE, "temperature": 0.5, "max_new_tokens": 8}).generating.generation_kwargs()
    assert (sampling["do_sample"], sampling["temperature"], sampling["top_p"], sampling["top_k"]) == (
        True,
        0.5,
        0.7,
        50,
    )
    assert sampling["max_new_tokens"] == 8 and "max_length" not in sampling
    greedy = parse_train_config({**BASE, "do_sample": False, "max_new_tokens": 0}).generating.generation_kwargs()
    assert greedy["do_sample"] is False and greedy["max_length"] == 1024 and "max_new_tokens" not in greedy
    assert not {"temperature", "top_p", "top_k"} & greedy.keys()  # transformers would warn on every generate()


def test_activation_checkpointing_is_on_for_training_unless_disabled_as_in_llamafactory():
    training = parse_train_config(BASE).training
    assert training.gradient_checkpointing is True and training.activation_checkpointing is True
    assert training.gradient_checkpointing_kwargs == {"use_reentrant": True}  # use_reentrant_gc defaults to True
    assert parse_train_config({**BASE, "use_reentrant_gc": False}).training.gradient_checkpointing_kwargs == {
        "use_reentrant": False
    }
    assert parse_train_config({**BASE, "disable_gradient_checkpointing": True}).training.gradient_checkpointing is False
    assert parse_train_config({**BASE, "do_train": False}).training.gradient_checkpointing is False


def test_models_that_cannot_checkpoint_train_without_it(caplog):
    import logging
    from types import SimpleNamespace

    from lathe.llm.workflows.setup import checkpointing_for

    training = parse_train_config(BASE).training
    with caplog.at_level(logging.WARNING):
        checkpointing_for(SimpleNamespace(supports_gradient_checkpointing=False), training)
    assert training.gradient_checkpointing is False and "does not support gradient checkpointing" in caplog.text
    training = parse_train_config(BASE).training
    checkpointing_for(SimpleNamespace(supports_gradient_checkpointing=True), training)
    assert training.gradient_checkpointing is True


@pytest.mark.parametrize("val_size", [1.5, 100.25, -0.1])
def test_val_size_is_a_fraction_below_one_or_a_whole_count(val_size):
    # LLaMA-Factory holds out int(1.5) = 1 example without a word.
    with pytest.raises(
        ValueError,
        match=rf"val_size must be a fraction below 1 \(e.g. 0.1\) or a whole number of "
        rf"examples \(e.g. 100\), got {val_size}",
    ):
        parse_train_config({**BASE, "val_size": val_size})
    for fine in (0.1, 1, 100, 100.0):
        assert parse_train_config({**BASE, "val_size": fine}).data.val_size == fine


def test_output_dir_that_is_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "taken").write_text("not a folder")
    # The exact path is caught where TrainingArguments is built (lathe.train's check, same for library users).
    with pytest.raises(ValueError, match=r"output_dir='.*taken' is an existing file, not a folder"):
        parse_train_config({**BASE, "output_dir": str(tmp_path / "taken")})
    with pytest.raises(ValueError, match=r"output_dir '.*taken/run' is inside .*taken, which is a file"):
        parse_train_config({**BASE, "output_dir": str(tmp_path / "taken" / "run")})
    assert parse_train_config({**BASE, "output_dir": str(tmp_path / "new" / "run")}).training.output_dir.endswith("run")


def test_lathe_train_with_a_file_as_output_dir_exits_2_without_a_traceback(tmp_path, write_yaml, capsys):
    from lathe.cli import main

    (tmp_path / "taken").write_text("not a folder")
    config = write_yaml(tmp_path / "c.yaml", {**BASE, "output_dir": str(tmp_path / "taken")})
    assert main(["train", config]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"lathe train: error: output_dir='{tmp_path / 'taken'}' is an existing file, not a folder")
    assert f"(in {config})" in error
    assert "Traceback" not in error


def test_training_arguments_keys_llamafactory_passes_to_transformers_reach_the_trainer():
    """LLaMA-Factory hands these to transformers' Seq2SeqTrainingArguments; lathe's has them too, with the same
    meaning (or transformers' clear error, as for pushing to the Hub offline)."""
    config = parse_train_config(
        {
            **BASE,
            "debug": "underflow_overflow",
            "enable_jit_checkpoint": True,
            "use_liger_kernel": True,
            "project": "demo",
            "hub_strategy": "end",
        }
    )
    training = config.training
    assert [option.value for option in training.debug] == ["underflow_overflow"]
    assert training.enable_jit_checkpoint is True and training.use_liger_kernel is True
    assert training.project == "demo" and training.hub_strategy.value == "end"
    with pytest.raises(ValueError, match="push_to_hub"):
        parse_train_config({**BASE, "push_to_hub": True})


@pytest.mark.parametrize(
    "stage, config", [("sft", None), ("dpo", {"fused_linear_cross_entropy": False, "cross_entropy": True})]
)
def test_enable_liger_kernel_is_use_liger_kernel_with_llamafactorys_logits_rule(stage, config):
    """LLaMA-Factory's enable_liger_kernel patches Liger in at load; lathe runs transformers' use_liger_kernel
    (Liger on a CUDA GPU, else its chunked loss), and for the stages that read logits switches Liger's fused
    linear cross-entropy off, as LLaMA-Factory's require_logits does."""
    training = parse_train_config({**BASE, "stage": stage, "enable_liger_kernel": True}).training
    assert training.use_liger_kernel is True and training.liger_kernel_config == config
    assert parse_train_config({**BASE, "stage": stage}).training.use_liger_kernel is False
