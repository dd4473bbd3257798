"""LLaMA-Factory 0.9.5's four vision-language example configs (examples/train_full/qwen3vl_full_sft.yaml,
train_lora/qwen3vl_lora_sft.yaml, train_lora/qwen3vl_lora_dpo.yaml, extras/oft/qwen2_5vl_oft_sft.yaml), their keys
written here, run by `lathe train` on a tiny local Qwen3-VL / Qwen2.5-VL in place of the hub id and data in the
shape of LLaMA-Factory's mllm_demo / rlhf_v / identity / alpaca_en_demo (rows and images made here). What is
changed for a 2-core test: model_name_or_path, dataset_dir, output_dir, two steps, fp32 (bf16 off),
preprocessing and dataloader workers off, and the full example's DeepSpeed ZeRO-3 file left out (one process)."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

from tests.llm import multimodal_cases as cases  # noqa: E402

COMMON = {
    "image_max_pixels": 262144,
    "video_max_pixels": 16384,
    "trust_remote_code": True,
    "do_train": True,
    "cutoff_len": 2048,
    "max_samples": 1000,
    "logging_steps": 10,
    "save_steps": 500,
    "plot_loss": True,
    "overwrite_output_dir": True,
    "save_only_model": False,
    "report_to": "none",
    "num_train_epochs": 3.0,
    "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.1,
    "ddp_timeout": 180000000,
    "resume_from_checkpoint": None,
}
LORA = {"finetuning_type": "lora", "lora_rank": 8, "lora_target": "all"}
EXAMPLES = {
    "qwen3vl_full_sft": (
        "qwen3_vl",
        {
            "stage": "sft",
            "finetuning_type": "full",
            "freeze_vision_tower": True,
            "freeze_multi_modal_projector": True,
            "freeze_language_model": False,
            "dataset": "mllm_demo,identity,alpaca_en_demo",
            "template": "qwen3_vl_nothink",
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 2,
            "learning_rate": 1.0e-5,
        },
    ),
    "qwen3vl_lora_sft": (
        "qwen3_vl",
        {
            "stage": "sft",
            **LORA,
            "dataset": "mllm_demo,identity,alpaca_en_demo",
            "template": "qwen3_vl_nothink",
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 8,
            "learning_rate": 1.0e-4,
        },
    ),
    "qwen3vl_lora_dpo": (
        "qwen3_vl",
        {
            "stage": "dpo",
            **LORA,
            "pref_beta": 0.1,
            "pref_loss": "sigmoid",
            "dataset": "rlhf_v",
            "template": "qwen3_vl_nothink",
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 8,
            "learning_rate": 5.0e-6,
        },
    ),
    "qwen2_5vl_oft_sft": (
        "qwen2_5_vl",
        {
            "stage": "sft",
            "finetuning_type": "oft",
            "oft_block_size": 32,
            "oft_target": "all",
            "dataset": "mllm_demo,identity,alpaca_en_demo",
            "template": "qwen2_vl",
            "overwrite_cache": True,
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 8,
            "learning_rate": 1.0e-4,
        },
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_llamafactory_vl_example_runs(tmp_path_factory, name):
    from lathe.llm.config.train import parse_train_config
    from lathe.llm.workflows.stages import run_train

    root = tmp_path_factory.mktemp(name)
    model_type, keys = EXAMPLES[name]
    model = cases.make_model_folder(root / "model", model_type)
    data = cases.make_data_folder(root / "data")
    local = {
        "model_name_or_path": str(model),
        "dataset_dir": str(data),
        "output_dir": str(root / "out"),
        "max_steps": 2,
        "bf16": False,
        "use_cpu": True,
        "preprocessing_num_workers": None,
        "dataloader_num_workers": 0,
    }
    run_train(parse_train_config({**COMMON, **keys, **local}))
    state = json.loads((root / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    (loss,) = [entry["train_loss"] for entry in state["log_history"] if "train_loss" in entry]
    assert 0 < loss < 20
    saved = sorted(path.name for path in (root / "out").iterdir())
    assert ("adapter_model.safetensors" if keys["finetuning_type"] != "full" else "model.safetensors") in saved
