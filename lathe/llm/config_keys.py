"""The LLaMA-Factory 0.9.5 keys lathe does not support yet, with LLaMA-Factory's default for each.

A config that sets one of these keys to its LLaMA-Factory default changes nothing, so it is
accepted; any other value is an error that says the feature is not supported yet (rather than
"unknown key", which would suggest a typo). Grouped by feature so the message can say what the
key belongs to.
"""
from __future__ import annotations

# feature (as the error message names it) -> {key: LLaMA-Factory default}
UNSUPPORTED_BY_FEATURE: dict[str, dict[str, object]] = {
    "model hubs and remote files (lathe loads local folders)": {
        "cache_dir": None, "model_revision": "main", "hf_hub_token": None, "ms_hub_token": None,
        "om_hub_token": None, "adapter_folder": None, "offload_folder": "offload",
    },
    "semantic initialisation of new special tokens": {
        "new_special_tokens_config": None, "init_special_tokens": "noise_init",
    },
    "model patches (RoPE scaling, S^2-Attn, mixture-of-depths, unsloth, liger kernels, MoE aux loss, v1 kernels)": {
        "rope_scaling": None, "shift_attn": False, "mixture_of_depths": None, "use_unsloth": False,
        "use_unsloth_gc": False, "enable_liger_kernel": False, "moe_aux_loss_coef": None,
        "use_v1_kernels": False, "use_liger_kernel": False, "liger_kernel_config": None,
    },
    "inference engines other than transformers (vLLM, SGLang, KTransformers)": {
        "infer_backend": "huggingface",
        "vllm_maxlen": 4096, "vllm_gpu_util": 0.7, "vllm_enforce_eager": False, "vllm_max_lora_rank": 32,
        "vllm_config": None, "sglang_maxlen": 4096, "sglang_mem_fraction": 0.7, "sglang_tp_size": -1,
        "sglang_config": None, "sglang_lora_backend": "triton", "use_kt": False, "kt_weight_path": None,
        "kt_expert_checkpoint_path": None, "kt_use_lora_experts": None, "kt_lora_expert_num": None,
        "kt_lora_expert_intermediate_size": None,
    },
    "multimodal inputs (images, video, audio)": {
        "media_dir": None, "image_max_pixels": 768 * 768, "image_min_pixels": 32 * 32,
        "image_do_pan_and_scan": False, "crop_to_patches": False, "video_max_pixels": 256 * 256,
        "video_min_pixels": 16 * 16, "video_fps": 2.0, "video_maxlen": 128, "use_audio_in_video": False,
        "audio_sampling_rate": 16000, "freeze_vision_tower": True, "freeze_multi_modal_projector": True,
        "freeze_language_model": False,
    },
    "export (in `lathe train`)": {
        "export_dir": None, "export_size": 5, "export_device": "cpu", "export_quantization_bit": None,
        "export_quantization_dataset": None, "export_quantization_nsamples": 128,
        "export_quantization_maxlen": 1024, "export_legacy_format": False, "export_hub_model_id": None,
    },
    "dataset streaming and shared-file-system preprocessing": {
        "streaming": False, "buffer_size": 16384, "data_shared_file_system": False,
    },
    "PPO (reinforcement learning with a reward model) and quantized reference models": {
        "ppo_buffer_size": 1, "ppo_epochs": 4, "ppo_score_norm": False, "ppo_target": 6.0,
        "ppo_whiten_rewards": False, "ref_model_quantization_bit": None, "reward_model": None,
        "reward_model_adapters": None, "reward_model_quantization_bit": None, "reward_model_type": "lora",
    },
    "special optimizers and losses (GaLore, APOLLO, BAdam, Adam-mini, Muon, DFT/ASFT/EAFT)": {
        "use_galore": False, "galore_target": "all", "galore_rank": 16, "galore_update_interval": 200,
        "galore_scale": 2.0, "galore_proj_type": "std", "galore_layerwise": False,
        "use_apollo": False, "apollo_target": "all", "apollo_rank": 16, "apollo_update_interval": 200,
        "apollo_scale": 32.0, "apollo_proj": "random", "apollo_proj_type": "std", "apollo_scale_type": "channel",
        "apollo_layerwise": False, "apollo_scale_front": False,
        "use_badam": False, "badam_mode": "layer", "badam_start_block": None, "badam_switch_mode": "ascending",
        "badam_switch_interval": 50, "badam_update_ratio": 0.05, "badam_mask_mode": "adjacent", "badam_verbose": 0,
        "use_adam_mini": False, "use_muon": False, "use_dft_loss": False,
        "use_asft_loss": False, "asft_alpha": 0.1, "use_eaft_loss": False, "eaft_alpha": 1.0,
        "optim_target_modules": None,
    },
    "other training back-ends (Megatron MCA, HyperParallel, Ray, FP8, accelerate config)": {
        "use_mca": False, "use_hyper_parallel": False, "hyper_parallel_args": None, "ray_num_workers": 1,
        "ray_init_kwargs": None, "fp8": False,
        "fp8_backend": "auto", "fp8_enable_fsdp_float8_all_gather": False, "accelerator_config": None,
        "parallelism_config": None, "enable_jit_checkpoint": False, "debug": "",
    },
    "the torch profiler integration": {
        "enable_torch_profiler": False, "profiler_output_dir": None, "profiler_wait_steps": 1,
        "profiler_warmup_steps": 1, "profiler_active_steps": 1, "profiler_repeat": 1,
        "profiler_record_shapes": True, "profiler_profile_memory": True, "profiler_with_stack": True,
        "profile_modules": None,
    },
    "experiment trackers other than tensorboard/jsonl (SwanLab, Trackio) and the Hub": {
        "use_swanlab": False, "swanlab_project": "llamafactory", "swanlab_workspace": None,
        "swanlab_run_name": None, "swanlab_mode": "cloud", "swanlab_api_key": None, "swanlab_logdir": None,
        "swanlab_lark_webhook_url": None, "swanlab_lark_secret": None, "project": "huggingface",
        "trackio_space_id": None, "trackio_bucket_id": None, "trackio_static_space_id": None,
        "hub_model_id": None, "hub_strategy": "every_save", "hub_token": None, "hub_private_repo": None,
        "hub_always_push": False, "hub_revision": None,
    },
    "training extras (token accuracy, shuffling off, effective tokens/s)": {
        "compute_accuracy": False, "disable_shuffling": False, "include_effective_tokens_per_second": False,
    },
}

UNSUPPORTED_KEYS: dict[str, tuple[str, object]] = {
    key: (feature, default) for feature, keys in UNSUPPORTED_BY_FEATURE.items() for key, default in keys.items()
}

SUPPORTED_STAGES = ("pt", "sft", "rm", "dpo", "kto")
SUPPORTED_FINETUNING_TYPES = ("full", "freeze", "lora", "oft")
