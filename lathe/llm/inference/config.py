"""The configuration of `lathe chat`, `lathe api` and `lathe export`: LLaMA-Factory's inference and
export keys (model, template, adapters, generation, export_*), parsed like `lathe train`'s.

LLaMA-Factory reads these files with the model, data, fine-tuning and generating arguments only, so a
training key there is an error; lathe says which command reads it instead. The data and fine-tuning
keys that matter here are `template` (how conversations are rendered, exactly as in training) and
`finetuning_type` (lora: `adapter_name_or_path` is merged into the base).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lathe.llm.config.keys import UNSUPPORTED_KEYS
from lathe.llm.config.methods import check_quantized_training
from lathe.llm.config.optim import OptimizerMethodArguments
from lathe.llm.config.train import DataArguments, FinetuningArguments, GeneratingArguments, ModelArguments, field_hints
from lathe.llm.config.values import RawConfig, build_sections, check_keys

__all__ = ["ExportArguments", "InferConfig", "parse_infer_config"]

# The export keys lathe supports; the rest of that group (quantization, the Hub) stays unsupported.
_SUPPORTED_EXPORT_KEYS = ("export_dir", "export_size", "export_device", "export_legacy_format", "export_gguf")


@dataclass
class ExportArguments:
    """Where and how `lathe export` writes the model."""

    _argument_group_name = "export"

    export_dir: str | None = field(default=None, metadata={"help": "Folder to write the exported model into."})
    export_size: float = field(default=5, metadata={"help": "Largest safetensors shard, in GB (1 GB = 10^9 bytes)."})
    export_device: Literal["cpu", "auto"] = field(
        default="cpu", metadata={"help": "Where to merge: cpu, or auto (the GPU when there is one)."}
    )
    export_legacy_format: bool = field(
        default=False, metadata={"help": "Write pytorch_model.bin (pickle) instead of safetensors; not supported."}
    )
    # lathe's own key (not LLaMA-Factory's): GGUF files for llama.cpp / Ollama beside the safetensors.
    export_gguf: Any = field(
        default=None,
        metadata={"help": "GGUF type(s) to write beside the folder: f16, bf16, q8_0, q4_k_m, q5_k_m, q6_k, f32."},
    )

    def __post_init__(self):
        if self.export_size <= 0:
            raise ValueError(f"export_size must be a positive number of GB, got {self.export_size}")
        from lathe.llm.gguf.writer import parse_gguf_types

        self.export_gguf = parse_gguf_types(self.export_gguf)
        if self.export_legacy_format:
            raise ValueError(
                "export_legacy_format: true (pickled .bin weights) is not supported: lathe writes safetensors."
            )


@dataclass
class InferConfig:
    model: ModelArguments
    data: DataArguments
    finetuning: FinetuningArguments
    generating: GeneratingArguments
    export: ExportArguments
    source: str | None = None

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {
            name: dataclasses.asdict(getattr(self, name))
            for name in ("model", "data", "finetuning", "generating", "export")
        }


_SECTIONS = {
    "model": ModelArguments,
    "data": DataArguments,
    "finetuning": FinetuningArguments,
    "generating": GeneratingArguments,
    "export": ExportArguments,
}
# Keys of the training sections that mean nothing to inference; they are left out of `known` so a
# training YAML passed by mistake gets one clear message.
_TRAINING_ONLY = {
    "data": (
        "dataset",
        "eval_dataset",
        "dataset_dir",
        "cutoff_len",
        "train_on_prompt",
        "mask_history",
        "mix_strategy",
        "interleave_probs",
        "overwrite_cache",
        "preprocessing_batch_size",
        "preprocessing_num_workers",
        "max_samples",
        "eval_num_beams",
        "ignore_pad_token_for_loss",
        "val_size",
        "eval_on_each_dataset",
        "packing",
        "neat_packing",
        "tokenized_path",
    ),
    "finetuning": (
        "freeze_trainable_layers",
        "freeze_trainable_modules",
        "freeze_extra_modules",
        "additional_target",
        "lora_alpha",
        "lora_dropout",
        "lora_rank",
        "lora_target",
        "use_rslora",
        "use_dora",
        "create_new_adapter",
        "pure_bf16",
        "early_stopping_steps",
        "plot_loss",
        "loraplus_lr_ratio",
        "loraplus_lr_embedding",
        "pissa_init",
        "pissa_iter",
        "pissa_convert",
        "module_dropout",
        "oft_rank",
        "oft_block_size",
        "oft_target",
        "use_llama_pro",
        "pref_beta",
        "pref_ftx",
        "pref_bco_weight",
        "pref_loss",
        "dpo_label_smoothing",
        "kto_chosen_weight",
        "kto_rejected_weight",
        "simpo_gamma",
        "ref_model",
        "ref_model_adapters",
        "ld_alpha",
        *(f.name for f in dataclasses.fields(OptimizerMethodArguments)),
    ),
    "model": (
        "disable_gradient_checkpointing",
        "use_reentrant_gc",
        "upcast_layernorm",
        "upcast_lmhead_output",
        "train_from_scratch",
        "resize_vocab",
    ),
}


def _training_key_hints(command: str) -> dict[str, str]:
    from lathe.llm.config.train import training_arguments_class

    message = (
        f"is a training key: `lathe {command}` reads the model, template, adapter, generation and export keys "
        "(write a separate inference config, as for LLaMA-Factory's chat/export)."
    )
    keys = {key for section in _TRAINING_ONLY.values() for key in section}
    keys |= {f.name for f in dataclasses.fields(training_arguments_class()) if f.init}
    return {key: message for key in keys}


def parse_infer_config(
    source: str | Path | dict, overrides: list[str] | tuple[str, ...] = (), command: str = "chat"
) -> InferConfig:
    """A LLaMA-Factory inference/export config (file or dict) plus `key=value` overrides."""
    config_input = RawConfig(source, overrides)
    raw, where = config_input.values, config_input.where
    hints = {name: field_hints(dtype) for name, dtype in _SECTIONS.items()}
    known = {
        key: hint
        for name, section in hints.items()
        for key, hint in section.items()
        if key not in _TRAINING_ONLY.get(name, ())
    }
    unsupported = {key: value for key, value in UNSUPPORTED_KEYS.items() if key not in _SUPPORTED_EXPORT_KEYS}
    check_keys(raw, list(known), config_input.origin, hints=_training_key_hints(command), unsupported=unsupported)
    config_input.coerce(known)
    built = build_sections(raw, _SECTIONS, hints, where)
    config = InferConfig(
        built["model"],
        built["data"],
        built["finetuning"],
        built["generating"],
        built["export"],
        source=config_input.path,
    )
    if config.model.adapter_name_or_path and config.finetuning.finetuning_type not in ("lora", "oft"):
        raise ValueError(
            f"adapter_name_or_path{where} needs finetuning_type: lora or oft (got {config.finetuning.finetuning_type!r})."
        )
    if config.finetuning.stage == "rm" and command != "export":
        raise ValueError(
            f"stage: rm{where}: a reward model scores answers instead of writing them; `lathe {command}` "
            "serves generating models only (scoring is not supported yet). `lathe export` with stage: rm "
            "exports it with its value head."
        )
    check_quantized_training(config.model, config.finetuning, None, where)
    return config
