"""The LLaMA-Factory 0.9.5 keys lathe does not support yet, with LLaMA-Factory's default for each.

A config that sets one of these keys to its LLaMA-Factory default changes nothing, so it is
accepted; any other value is an error that says the feature is not supported yet (rather than
"unknown key", which would suggest a typo). Grouped by feature so the message can say what the
key belongs to.
"""

from __future__ import annotations

# feature (as the error message names it) -> {key: LLaMA-Factory default}
UNSUPPORTED_BY_FEATURE: dict[str, dict[str, object]] = {
    "the OpenMind hub and remote adapter options (lathe reads the Hugging Face Hub and ModelScope)": {
        "om_hub_token": None,
        "adapter_folder": None,
        "offload_folder": "offload",
    },
    "semantic initialisation of new special tokens": {
        "new_special_tokens_config": None,
        "init_special_tokens": "noise_init",
    },
    "model patches (RoPE scaling, S^2-Attn, unsloth)": {
        "rope_scaling": None,
        "shift_attn": False,
        "use_unsloth": False,
        "use_unsloth_gc": False,
    },
    "inference engines other than transformers (vLLM, SGLang, KTransformers)": {
        "infer_backend": "huggingface",
        "vllm_maxlen": 4096,
        "vllm_gpu_util": 0.7,
        "vllm_enforce_eager": False,
        "vllm_max_lora_rank": 32,
        "vllm_config": None,
        "sglang_maxlen": 4096,
        "sglang_mem_fraction": 0.7,
        "sglang_tp_size": -1,
        "sglang_config": None,
        "sglang_lora_backend": "triton",
    },
    "export (in `lathe train`; `lathe export` reads it)": {
        "export_dir": None,
        "export_size": 5,
        "export_device": "cpu",
        "export_legacy_format": False,
    },
    "GPTQ quantization while exporting (LLaMA-Factory runs optimum's GPTQ there)": {
        "export_quantization_bit": None,
        "export_quantization_dataset": None,
        "export_quantization_nsamples": 128,
        "export_quantization_maxlen": 1024,
    },
    "pushing the exported model to a model hub (lathe works offline)": {
        "export_hub_model_id": None,
    },
    "dataset streaming and shared-file-system preprocessing": {
        "streaming": False,
        "buffer_size": 16384,
        "data_shared_file_system": False,
    },
    "PPO (reinforcement learning with a reward model) and quantized reference models": {
        "ppo_buffer_size": 1,
        "ppo_epochs": 4,
        "ppo_score_norm": False,
        "ppo_target": 6.0,
        "ppo_whiten_rewards": False,
        "ref_model_quantization_bit": None,
        "reward_model": None,
        "reward_model_adapters": None,
        "reward_model_quantization_bit": None,
        "reward_model_type": "lora",
    },
    "the torch profiler integration": {
        "enable_torch_profiler": False,
        "profiler_output_dir": None,
        "profiler_wait_steps": 1,
        "profiler_warmup_steps": 1,
        "profiler_active_steps": 1,
        "profiler_repeat": 1,
        "profiler_record_shapes": True,
        "profiler_profile_memory": True,
        "profiler_with_stack": True,
        "profile_modules": None,
    },
    "the SwanLab experiment tracker": {
        "use_swanlab": False,
        "swanlab_project": "llamafactory",
        "swanlab_workspace": None,
        "swanlab_run_name": None,
        "swanlab_mode": "cloud",
        "swanlab_api_key": None,
        "swanlab_logdir": None,
        "swanlab_lark_webhook_url": None,
        "swanlab_lark_secret": None,
    },
    "training extras (token accuracy, shuffling off, effective tokens/s)": {
        "compute_accuracy": False,
        "disable_shuffling": False,
        "include_effective_tokens_per_second": False,
    },
}

UNSUPPORTED_KEYS: dict[str, tuple[str, object]] = {
    key: (feature, default) for feature, keys in UNSUPPORTED_BY_FEATURE.items() for key, default in keys.items()
}

# TRL 1.16 GRPOConfig keys (with TRL's defaults) that lathe's stage grpo does not implement yet: at TRL's default
# they change nothing and are dropped, any other value is an error naming the key (not "unknown key").
TRL_GRPO_NOT_IMPLEMENTED: dict[str, object] = {
    "model_init_kwargs": None,
    "router_aux_loss_coef": None,
    "cast_lm_head_to_fp32": False,
    "num_generations_eval": None,
    "pad_to_multiple_of": "auto",
    "cache_implementation": None,
    "chat_template_kwargs": None,
    "use_vllm": False,
    "vllm_mode": "colocate",
    "vllm_model_impl": "vllm",
    "vllm_enable_sleep_mode": False,
    "vllm_structured_outputs_regex": None,
    "vllm_server_base_url": None,
    "vllm_server_host": "0.0.0.0",
    "vllm_server_port": 8000,
    "vllm_server_timeout": 240.0,
    "vllm_group_port": 51216,
    "vllm_gpu_memory_utilization": 0.3,
    "vllm_max_model_length": None,
    "vllm_tensor_parallel_size": 1,
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None,
    "vllm_importance_sampling_cap": None,
    "sync_ref_model": False,
    "ref_model_mixup_alpha": 0.6,
    "ref_model_sync_steps": 512,
    "entropy_coef": 0.0,
    "use_adaptive_entropy": False,
    "entropy_coef_min": 0.0,
    "entropy_coef_max": 1.0,
    "entropy_coef_delta": 0.005,
    "entropy_target": 0.2,
    "off_policy_mask_threshold": None,
    "log_completions": False,
    "log_multimodal": True,
    "num_completions_to_print": None,
    "log_unique_prompts": False,
    "log_completions_hub_repo": None,
    "use_transformers_continuous_batching": False,
    "transformers_continuous_batching_config": None,
    "use_transformers_paged": False,
}

SUPPORTED_STAGES = ("pt", "sft", "rm", "dpo", "kto", "grpo", "rloo")
SUPPORTED_FINETUNING_TYPES = ("full", "freeze", "lora", "oft")


# ----------------------------------------------------------------------------------------------
# What cannot run here, and why: a config that sets one of these stops at once with one line.

ANY_VALUE = object()  # keys that only configs for that back-end carry: their presence is the request

_MEGATRON = (
    "a Megatron-Core key (LLaMA-Factory's USE_MCA back-end), which lathe does not run: use FSDP2 "
    "(fsdp) or DeepSpeed ZeRO (deepspeed) to shard the model."
)
_KTRANSFORMERS = (
    "KTransformers (use_kt) runs MoE experts on the CPU through the kt-kernel package and "
    "patched transformers/accelerate builds, which lathe does not integrate."
)
_HYPER_PARALLEL = "HyperParallel is not supported: use FSDP2 (fsdp) or DeepSpeed ZeRO (deepspeed)."
_MEGATRON_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "sequence_parallel",
    "bias_activation_fusion",
    "apply_rope_fusion",
    "use_distributed_optimizer",
    "overlap_param_gather",
    "overlap_grad_reduce",
    "moe_grouped_gemm",
    "moe_token_dispatcher_type",
    "moe_layer_recompute",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "transformer_impl",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
)

# key -> (LLaMA-Factory's default, which changes nothing; or ANY_VALUE) and why it cannot run.
REFUSED_KEYS: dict[str, tuple[object, str]] = {
    # Refused where a GPU is (see refusal_reason); on a CPU, where LLaMA-Factory has none to apply, see applies_nothing.
    "use_v1_kernels": (False, ""),
    **{
        key: (default, _KTRANSFORMERS)
        for key, default in {
            "use_kt": False,
            "kt_weight_path": None,
            "kt_expert_checkpoint_path": None,
            "kt_use_lora_experts": None,
            "kt_lora_expert_num": None,
            "kt_lora_expert_intermediate_size": None,
        }.items()
    },
    "use_mca": (False, _MEGATRON),
    **{key: (ANY_VALUE, _MEGATRON) for key in _MEGATRON_KEYS},
    "use_hyper_parallel": (False, _HYPER_PARALLEL),
    "hyper_parallel_args": (None, _HYPER_PARALLEL),
    # Their reason depends on the machine or on an installed package: see refusal_reason.
    "fp8": (False, ""),
    "fp8_backend": ("auto", ""),
    "fp8_enable_fsdp_float8_all_gather": (False, ""),
    "mixture_of_depths": (None, ""),
}


def applies_nothing(key: str, value) -> str | None:
    """What to log when `key`, set to `value`, does nothing in LLaMA-Factory on this machine either (so lathe
    runs without it); None when it would act and must be refused."""
    # true and "auto" ask for every kernel LLaMA-Factory registered for this machine's accelerator.
    if key == "use_v1_kernels" and str(value).lower() in ("true", "auto"):
        import torch

        if not torch.cuda.is_available():
            # LLaMA-Factory registers a v1 kernel only for the accelerator it was written for (NPU, CUDA).
            return (
                "use_v1_kernels: LLaMA-Factory's v1 kernels are Ascend NPU and CUDA/Triton operators; none exists "
                "for the CPU, so none is applied (as in LLaMA-Factory on this machine)."
            )
    return None


def refusal_reason(key: str) -> str:
    """Why `key`, set, cannot run here (one sentence)."""
    if key == "use_v1_kernels":
        import torch

        if not torch.cuda.is_available():  # a named kernel: LLaMA-Factory has none for the CPU and stops too
            return (
                "a list of LLaMA-Factory's v1 kernels names Ascend NPU or CUDA/Triton operators, of which none exists "
                "for the CPU (LLaMA-Factory stops with 'Kernel ... not found' here): use true or remove the key."
            )
        return (
            "LLaMA-Factory's v1 kernels (fused Ascend NPU operators through torch_npu, CUDA/Triton fused-MoE "
            "kernels) are not part of lathe, and on this machine LLaMA-Factory would apply them: remove the key."
        )
    if key.startswith("fp8"):
        return _fp8_reason()
    if key == "mixture_of_depths":
        return _mixture_of_depths_reason()
    return REFUSED_KEYS[key][1]


def _fp8_reason() -> str:
    import torch

    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9):
        return "FP8 training is not supported by lathe yet (this GPU has FP8 tensor cores): train in bf16."
    return (
        "FP8 training needs a GPU with FP8 tensor cores (NVIDIA compute capability 8.9 or newer, e.g. L4, H100); "
        "this machine has none: train in bf16 or fp32."
    )


def _mixture_of_depths_reason() -> str:
    try:
        import MoD  # noqa: F401  (the mixture-of-depth package)
    except Exception as error:  # 1.2.0 imports TRANSFORMERS_CACHE, which transformers 5 removed
        return (
            f"Mixture-of-Depths needs the mixture-of-depth package, which does not import here "
            f"({type(error).__name__}: {error})."
        )
    return "Mixture-of-Depths (convert / load) is not supported by lathe yet."
