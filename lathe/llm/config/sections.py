"""The model and data sections of a `lathe train` config (ModelArguments, DataArguments): LLaMA-Factory
0.9.5's keys and defaults that lathe supports, each checked when the section is made. train.py
assembles them with the fine-tuning, generation and training sections into a TrainConfig."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from lathe.llm.config.media import ProcessorArguments
from lathe.llm.config.methods import check_quantization_bit
from lathe.llm.config.values import split_commas


def hub_from_environment() -> str:
    """LLaMA-Factory's switches, read with the config: USE_MODELSCOPE_HUB / USE_OPENMIND_HUB (true, y or 1)."""
    for name, hub in (("USE_MODELSCOPE_HUB", "modelscope"), ("USE_OPENMIND_HUB", "openmind")):
        if os.environ.get(name, "0").lower() in ("true", "y", "1"):
            return hub
    return "huggingface"


def help_text(text: str) -> dict:
    return {"help": text}


@dataclass
class ModelArguments(ProcessorArguments):
    """Which model and tokenizer to load, and how (LLaMA-Factory's model arguments that lathe supports)."""

    _argument_group_name = "model"

    model_name_or_path: str | None = field(
        default=None,
        metadata=help_text(
            "The model and tokenizer: a local folder (from save_pretrained) or a hub id such as Org/Name (downloaded "
            "once into the Hugging Face cache; ModelScope with USE_MODELSCOPE_HUB=1)."
        ),
    )
    adapter_name_or_path: str | None = field(
        default=None,
        metadata=help_text(
            "LoRA adapter folder(s) or hub id(s), comma separated: all but the last are merged; the last is trained further (or merged too with create_new_adapter)."
        ),
    )
    cache_dir: str | None = field(
        default=None,
        metadata=help_text("Where hub downloads are kept (default: the Hugging Face cache, HF_HUB_CACHE)."),
    )
    model_revision: str = field(
        default="main", metadata=help_text("The branch, tag or commit of hub ids (model, adapters, ref_model).")
    )
    hf_hub_token: str | None = field(
        default=None, metadata=help_text("Hugging Face Hub token (default: HF_TOKEN or the one `hf auth login` saved).")
    )
    ms_hub_token: str | None = field(default=None, metadata=help_text("ModelScope token (USE_MODELSCOPE_HUB=1)."))
    use_fast_tokenizer: bool = field(default=True, metadata=help_text("Use the fast (tokenizers-backed) tokenizer."))
    resize_vocab: bool = field(
        default=False, metadata=help_text("Resize the embeddings to the tokenizer's vocabulary size.")
    )
    split_special_tokens: bool = field(
        default=False, metadata=help_text("Tokenize special-token text as ordinary text.")
    )
    add_tokens: str | None = field(
        default=None,
        metadata=help_text("Ordinary tokens to add to the vocabulary, comma separated (resizes the embeddings)."),
    )
    add_special_tokens: str | None = field(
        default=None,
        metadata=help_text("Special tokens to add to the vocabulary, comma separated (resizes the embeddings)."),
    )
    low_cpu_mem_usage: bool = field(
        default=True, metadata=help_text("Load weights without first building a randomly initialised copy.")
    )
    allow_model_change: bool = field(
        default=False,
        metadata=help_text(
            "lathe: resume a run whose lathe_train_config.yaml names another model_name_or_path (refused otherwise)."
        ),
    )
    flash_attn: Literal["auto", "disabled", "sdpa", "fa2", "fa3"] = field(
        default="auto",
        metadata=help_text(
            "Attention implementation: auto (the model's default), disabled (eager), sdpa, fa2 (flash_attention_2), fa3 (flash_attention_3)."
        ),
    )
    enable_liger_kernel: bool = field(
        default=False,
        metadata=help_text(
            "Liger-Kernel's fused kernels (CUDA GPU, liger-kernel installed); elsewhere lathe's chunked "
            "cross-entropy, logged (transformers' use_liger_kernel)."
        ),
    )
    disable_gradient_checkpointing: bool = field(
        default=False,
        metadata=help_text(
            "Train without activation (gradient) checkpointing: faster, more memory. It is on by default, as in LLaMA-Factory."
        ),
    )
    use_reentrant_gc: bool = field(default=True, metadata=help_text("Use reentrant gradient checkpointing."))
    upcast_layernorm: bool = field(default=False, metadata=help_text("Keep normalisation weights in float32."))
    upcast_lmhead_output: bool = field(
        default=False, metadata=help_text("Compute the output head's logits in float32.")
    )
    train_from_scratch: bool = field(
        default=False,
        metadata=help_text("Build the model from its config with random weights instead of loading them."),
    )
    use_kv_cache: bool = field(
        default=True, metadata=help_text("Use the KV cache when generating (it is always off while training).")
    )
    moe_aux_loss_coef: float | None = field(
        default=None,
        metadata=help_text(
            "Add the MoE router's load-balancing loss times this to the training loss, for the families "
            "LLaMA-Factory turns it on for (lathe.llm.model.moe)."
        ),
    )
    infer_dtype: Literal["auto", "float16", "bfloat16", "float32"] = field(
        default="auto",
        metadata=help_text("Weights dtype when not training (auto: the checkpoint's dtype, float32 on CPU)."),
    )
    print_param_status: bool = field(
        default=False, metadata=help_text("Print every parameter's dtype, device and trainability.")
    )
    trust_remote_code: bool = field(default=False, metadata=help_text("Allow a model folder's own Python code to run."))
    quantization_method: Literal["bnb", "hqq", "eetq"] = field(
        default="bnb",
        metadata=help_text("On-the-fly quantization of the base: bnb (bitsandbytes), hqq or eetq (GPU only)."),
    )
    quantization_bit: int | None = field(
        default=None,
        metadata=help_text(
            "Load the base quantized to this many bits (QLoRA): 4 or 8 for bnb; 1-8 for hqq; 8 for eetq."
        ),
    )
    quantization_type: Literal["fp4", "nf4"] = field(
        default="nf4", metadata=help_text("bnb 4-bit data type: nf4 or fp4.")
    )
    double_quantization: bool = field(
        default=True, metadata=help_text("bnb 4-bit: quantize the quantization constants too.")
    )
    quantization_device_map: Literal["auto"] | None = field(
        default=None,
        metadata=help_text("auto: spread a 4-bit model over the devices for inference (not for training)."),
    )

    # Derived by parse_train_config; not settable from a config file.
    compute_dtype: str | None = field(
        default=None, init=False, metadata=help_text("bfloat16/float16 from bf16/fp16/pure_bf16, else None.")
    )
    model_max_length: int | None = field(default=None, init=False, metadata=help_text("cutoff_len, for the tokenizer."))
    block_diag_attn: bool = field(
        default=False, init=False, metadata=help_text("neat_packing: attention may not cross packed examples.")
    )
    model_hub: str = field(
        default="huggingface",
        init=False,
        metadata=help_text("Where hub ids come from: modelscope with USE_MODELSCOPE_HUB=1, else huggingface."),
    )

    def __post_init__(self):
        if self.model_name_or_path is None:
            raise ValueError(
                "model_name_or_path is required: a local folder holding the model (config.json) and its tokenizer, "
                "or a hub id such as Org/Name."
            )
        self.model_hub = hub_from_environment()
        self.adapter_name_or_path = split_commas(self.adapter_name_or_path)
        self.add_tokens = split_commas(self.add_tokens)
        self.add_special_tokens = split_commas(self.add_special_tokens)
        check_quantization_bit(self.quantization_method, self.quantization_bit)
        self.check_media_pixels()


@dataclass
class DataArguments:
    """Which datasets, how they are templated, truncated and packed (LLaMA-Factory's data arguments)."""

    _argument_group_name = "data"

    template: str | None = field(
        default=None, metadata=help_text("Chat template name; None uses the tokenizer's own chat_template.")
    )
    dataset: str | None = field(
        default=None, metadata=help_text("Training dataset name(s) from dataset_info.json, comma separated.")
    )
    eval_dataset: str | None = field(default=None, metadata=help_text("Evaluation dataset name(s), comma separated."))
    dataset_dir: str = field(default="data", metadata=help_text("Folder holding dataset_info.json and the data files."))
    media_dir: str | None = field(
        default=None, metadata=help_text("Folder the images, videos and audio paths are relative to (dataset_dir).")
    )
    cutoff_len: int = field(default=2048, metadata=help_text("Maximum tokens per example (prompt + response)."))
    train_on_prompt: bool = field(default=False, metadata=help_text("Train on prompt tokens too (no prompt masking)."))
    mask_history: bool = field(default=False, metadata=help_text("Train on the last assistant turn only."))
    mix_strategy: Literal["concat", "interleave_under", "interleave_over", "interleave_once"] = field(
        default="concat", metadata=help_text("How several datasets are mixed.")
    )
    interleave_probs: str | None = field(
        default=None, metadata=help_text("Sampling probabilities per dataset for interleaving, comma separated.")
    )
    overwrite_cache: bool = field(default=False, metadata=help_text("Re-tokenize even when a cache entry exists."))
    preprocessing_batch_size: int = field(default=1000, metadata=help_text("Examples per batch in preprocessing."))
    preprocessing_num_workers: int | None = field(default=None, metadata=help_text("Processes for preprocessing."))
    max_samples: int | None = field(
        default=None, metadata=help_text("Keep at most this many examples of each dataset.")
    )
    eval_num_beams: int | None = field(
        default=None, metadata=help_text("Beams for generation in evaluation (generation_num_beams).")
    )
    ignore_pad_token_for_loss: bool = field(
        default=True, metadata=help_text("Pad labels with -100 so padding is not trained.")
    )
    val_size: float = field(
        default=0.0,
        metadata=help_text("Held-out part of the training data: a fraction in [0, 1) or a number of examples."),
    )
    eval_on_each_dataset: bool = field(default=False, metadata=help_text("Evaluate each eval dataset separately."))
    packing: bool | None = field(
        default=None, metadata=help_text("Pack examples into cutoff_len rows (default: true for pt, false for sft).")
    )
    neat_packing: bool = field(
        default=False, metadata=help_text("Packing where attention cannot cross examples (implies packing).")
    )
    tool_format: str | None = field(default=None, metadata=help_text("Tool-call format for function-calling examples."))
    default_system: str | None = field(
        default=None, metadata=help_text("Override the template's default system message.")
    )
    enable_thinking: bool | None = field(default=True, metadata=help_text("Thinking mode for reasoning templates."))
    preserve_thinking: bool = field(default=False, metadata=help_text("Keep thinking content in earlier turns."))
    tokenized_path: str | None = field(
        default=None, metadata=help_text("Save the tokenized datasets here, or load them when it exists.")
    )
    max_dropped_rows_share: float = field(
        default=0.1,
        metadata=help_text(
            "lathe: stop when tokenizing leaves out more than this share of the training examples (unusable, or "
            "cutoff_len cuts through their media), or when cutoff_len cuts more than this share (and more than "
            "half) of the trained tokens; 1.0 trains on whatever is left."
        ),
    )

    def __post_init__(self):
        self.dataset = split_commas(self.dataset)
        self.eval_dataset = split_commas(self.eval_dataset)
        if self.media_dir is None:
            self.media_dir = self.dataset_dir
        if self.cutoff_len <= 0:
            raise ValueError(f"cutoff_len must be a positive number of tokens, got {self.cutoff_len}")
        if not 0 <= self.max_dropped_rows_share <= 1:
            raise ValueError(f"max_dropped_rows_share must be a share from 0 to 1, got {self.max_dropped_rows_share}")
        if self.val_size < 0 or (self.val_size > 1 and self.val_size != int(self.val_size)):
            # LLaMA-Factory would silently hold out int(1.5) = 1 example: a float above 1 is not a count.
            raise ValueError(
                f"val_size must be a fraction below 1 (e.g. 0.1) or a whole number of examples "
                f"(e.g. 100), got {self.val_size}"
            )
        if self.dataset is None and self.val_size > 1e-6:
            raise ValueError("val_size needs a training dataset to split: set dataset.")
        if self.eval_dataset is not None and self.val_size > 1e-6:
            raise ValueError("Set either val_size (split the training data) or eval_dataset, not both.")
        if self.interleave_probs is not None:
            if self.mix_strategy == "concat":
                raise ValueError(
                    "interleave_probs only applies to mix_strategy interleave_under/interleave_over/interleave_once."
                )
            self.interleave_probs = [float(p) for p in split_commas(self.interleave_probs)]
            for name, names in (("dataset", self.dataset), ("eval_dataset", self.eval_dataset)):
                if names is not None and len(names) != len(self.interleave_probs):
                    raise ValueError(
                        f"interleave_probs has {len(self.interleave_probs)} values but {name} names {len(names)} datasets."
                    )
        if self.mask_history and self.train_on_prompt:
            raise ValueError("mask_history and train_on_prompt contradict each other: set at most one.")
        if self.neat_packing:
            self.packing = True
