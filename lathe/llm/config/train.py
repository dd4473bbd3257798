"""The `lathe train` configuration: LLaMA-Factory 0.9.5 keys and defaults, parsed and validated once.

`parse_train_config(source, overrides)` reads a YAML/JSON file (or a dict), applies command-line
overrides, and returns a `TrainConfig` of five dataclasses. Precedence: defaults < file < overrides.
Everything that can be checked without loading a model or data is checked here, with errors that
name the key and the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lathe.llm.config.grpo import GRPOArguments, check_grpo_options
from lathe.llm.config.keys import SUPPORTED_FINETUNING_TYPES, SUPPORTED_STAGES
from lathe.llm.config.launch import LAUNCH_KEYS, RAY_KEYS, check_ray_keys
from lathe.llm.config.media import TowerArguments
from lathe.llm.config.methods import check_methods, check_quantized_training, target_modules
from lathe.llm.config.optim import OptimizerMethodArguments, validate_methods
from lathe.llm.config.preference import check_preference_arguments
from lathe.llm.config.sections import DataArguments, ModelArguments
from lathe.llm.config.sections import help_text as _help
from lathe.llm.config.stages import check_stage_options, resolve_liger_kernel
from lathe.llm.config.values import RawConfig, build_sections, check_keys, parse_overrides, split_commas

__all__ = [
    "DataArguments",
    "FinetuningArguments",
    "GeneratingArguments",
    "ModelArguments",
    "TrainConfig",
    "parse_overrides",
    "parse_train_config",
    "split_commas",
]


@dataclass
class FinetuningArguments(OptimizerMethodArguments, GRPOArguments, TowerArguments):
    """Which stage and method: full, freeze or LoRA, and the optimizer and loss keys (lathe.llm.config.optim)."""

    _argument_group_name = "finetuning"

    stage: Literal["pt", "sft", "rm", "ppo", "dpo", "kto", "grpo", "rloo"] = field(
        default="sft",
        metadata=_help(
            "Training stage: pt (pre-training), sft, rm (reward model), dpo, kto, grpo or rloo (online RL)."
        ),
    )
    finetuning_type: Literal["lora", "oft", "freeze", "full"] = field(
        default="lora", metadata=_help("full, freeze, lora or oft.")
    )
    use_llama_pro: bool = field(
        default=False,
        metadata=_help(
            "freeze/lora: train only the blocks `lathe expand` added (LLaMA Pro); freeze_trainable_layers = how many."
        ),
    )
    freeze_trainable_layers: int = field(
        default=2, metadata=_help("freeze: train the last n hidden layers (n > 0) or the first -n (n < 0).")
    )
    freeze_trainable_modules: str = field(
        default="all", metadata=_help("freeze: modules inside the trainable layers (e.g. mlp,self_attn), or all.")
    )
    freeze_extra_modules: str | None = field(
        default=None, metadata=_help("freeze: modules outside the hidden layers to train too (e.g. embed_tokens,norm).")
    )
    additional_target: str | None = field(
        default=None,
        metadata=_help("lora: modules trained in full and saved with the adapter (e.g. embed_tokens,lm_head)."),
    )
    lora_alpha: int | None = field(default=None, metadata=_help("lora: scale factor (default 2 x lora_rank)."))
    lora_dropout: float = field(default=0.0, metadata=_help("lora: dropout on the adapter input."))
    lora_rank: int = field(default=8, metadata=_help("lora: rank of the update matrices."))
    lora_target: str = field(
        default="all",
        metadata=_help(
            "lora: module names to adapt, comma separated; all = every linear layer but the output head; "
            "or one regular expression matched against whole module paths (peft's rule)."
        ),
    )
    loraplus_lr_ratio: float | None = field(
        default=None, metadata=_help("lora: LoRA+, learning rate of the B matrices = learning_rate x this.")
    )
    loraplus_lr_embedding: float = field(
        default=1e-6, metadata=_help("lora: LoRA+ learning rate of embedding adapters' B matrices.")
    )
    pissa_init: bool = field(
        default=False, metadata=_help("lora: initialise the adapter from the principal singular vectors (PiSSA).")
    )
    pissa_iter: int = field(default=16, metadata=_help("lora: fast-SVD iterations for PiSSA; -1 = exact SVD."))
    pissa_convert: bool = field(
        default=False,
        metadata=_help(
            "lora: also save the PiSSA adapter converted to a plain LoRA of the original base (pissa_converted/)."
        ),
    )
    module_dropout: float = field(
        default=0.0, metadata=_help("oft: probability of dropping a whole OFT block in training.")
    )
    oft_rank: int = field(default=0, metadata=_help("oft: number of OFT blocks (0: set by oft_block_size)."))
    oft_block_size: int = field(default=32, metadata=_help("oft: size of each OFT block (0: set by oft_rank)."))
    oft_target: str = field(
        default="all",
        metadata=_help("oft: module names to adapt, comma separated; all = every linear layer but the output head."),
    )
    use_rslora: bool = field(default=False, metadata=_help("lora: rank-stabilised scaling alpha/sqrt(r)."))
    use_dora: bool = field(default=False, metadata=_help("lora: weight-decomposed LoRA (DoRA)."))
    create_new_adapter: bool = field(
        default=False, metadata=_help("lora: merge adapter_name_or_path into the model and train a fresh adapter.")
    )
    pure_bf16: bool = field(default=False, metadata=_help("Train in bfloat16 without float32 master weights."))
    early_stopping_steps: int | None = field(
        default=None, metadata=_help("Stop when metric_for_best_model has not improved for this many evaluations.")
    )
    plot_loss: bool = field(
        default=False, metadata=_help("Save training_loss.png (and training_eval_loss.png) in output_dir.")
    )
    # Preference training (dpo, kto); validated in lathe.llm.config.preference.
    pref_beta: float = field(
        default=0.1, metadata=_help("dpo/kto: beta, the strength of the pull towards the reference model.")
    )
    pref_ftx: float = field(
        default=0.0,
        metadata=_help(
            "dpo/kto: weight of the SFT loss (chosen answers' mean token NLL) added to the preference loss."
        ),
    )
    pref_bco_weight: float = field(default=0.0, metadata=_help("dpo: weight of the BCO loss mixed into the DPO loss."))
    pref_loss: Literal["sigmoid", "hinge", "ipo", "kto_pair", "orpo", "simpo"] = field(
        default="sigmoid",
        metadata=_help(
            "dpo: the loss: sigmoid (DPO), hinge, ipo, orpo or simpo (orpo and simpo need no reference model)."
        ),
    )
    dpo_label_smoothing: float = field(
        default=0.0, metadata=_help("dpo sigmoid: label smoothing in [0, 0.5) (conservative DPO).")
    )
    kto_chosen_weight: float = field(default=1.0, metadata=_help("kto: weight of the desirable examples' losses."))
    kto_rejected_weight: float = field(default=1.0, metadata=_help("kto: weight of the undesirable examples' losses."))
    simpo_gamma: float = field(default=0.5, metadata=_help("dpo simpo: the target reward margin."))
    ref_model: str | None = field(
        default=None,
        metadata=_help("dpo/kto: folder of the reference model (default: the model being trained, before training)."),
    )
    ref_model_adapters: str | None = field(
        default=None, metadata=_help("dpo/kto: LoRA adapter folder(s) merged into ref_model, comma separated.")
    )
    ld_alpha: float | None = field(
        default=None, metadata=_help("dpo: LD-DPO weight of the response tokens past the shorter answer's length.")
    )

    # Derived in __post_init__; not settable from a config file.
    use_ref_model: bool = field(
        default=False, init=False, metadata=_help("dpo with a loss that compares against a reference model.")
    )

    def __post_init__(self):
        self.ref_model_adapters = split_commas(self.ref_model_adapters)
        self.use_ref_model = self.stage == "dpo" and self.pref_loss not in ("orpo", "simpo")
        check_preference_arguments(self)
        self.freeze_trainable_modules = split_commas(self.freeze_trainable_modules)
        self.freeze_extra_modules = split_commas(self.freeze_extra_modules)
        self.additional_target = split_commas(self.additional_target)
        self.lora_target = target_modules(self.lora_target, "lora_target")
        self.oft_target = target_modules(self.oft_target, "oft_target")
        if self.lora_rank <= 0:
            raise ValueError(f"lora_rank must be a positive integer, got {self.lora_rank}")
        self.lora_alpha = self.lora_alpha or self.lora_rank * 2
        check_methods(self)
        self.check_optimizer_keys()
        self.check_grpo_keys()


@dataclass
class GeneratingArguments:
    """Decoding settings for do_predict (and later chat/api), with LLaMA-Factory's defaults."""

    _argument_group_name = "generating"

    do_sample: bool = field(default=True, metadata=_help("Sample; greedy decoding when false."))
    temperature: float = field(default=0.95, metadata=_help("Sampling temperature."))
    top_p: float = field(default=0.7, metadata=_help("Nucleus sampling probability mass."))
    top_k: int = field(default=50, metadata=_help("Sample among the k most likely tokens."))
    num_beams: int = field(default=1, metadata=_help("Beams for beam search (1: none)."))
    max_length: int = field(default=1024, metadata=_help("Maximum total tokens; max_new_tokens wins when positive."))
    max_new_tokens: int = field(default=1024, metadata=_help("Maximum generated tokens."))
    repetition_penalty: float = field(default=1.0, metadata=_help("Repetition penalty (1.0: none)."))
    length_penalty: float = field(default=1.0, metadata=_help("Length penalty for beam search."))
    skip_special_tokens: bool = field(default=True, metadata=_help("Drop special tokens when decoding."))

    def generation_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `model.generate`: max_new_tokens when positive, else max_length."""
        kwargs = dataclasses.asdict(self)
        kwargs.pop("skip_special_tokens")
        if kwargs["max_new_tokens"] > 0:
            kwargs.pop("max_length")
        else:
            kwargs.pop("max_new_tokens")
        if not self.do_sample:
            # Greedy decoding ignores them; passed anyway, transformers warns on every generate().
            for name in ("temperature", "top_p", "top_k"):
                kwargs.pop(name)
        return kwargs


@dataclass
class TrainConfig:
    """Everything `lathe train` needs; `training` is a `lathe.train.Seq2SeqTrainingArguments`."""

    model: ModelArguments
    data: DataArguments
    training: Any
    finetuning: FinetuningArguments
    generating: GeneratingArguments
    source: str | None = None  # the file it came from, for messages
    # The keys as given (file, then command line), converted to their types: the flat LLaMA-Factory form
    # that `lathe train` reads back, saved in output_dir/lathe_train_config.yaml.
    given: dict[str, Any] = field(default_factory=dict)
    processes: int | None = None  # the job's processes, all nodes, as planned before launch (a dry run)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The resolved values per section, JSON-friendly (for printing and for the output folder)."""
        sections = {}
        for name in ("model", "data", "finetuning", "generating"):
            sections[name] = _jsonable(dataclasses.asdict(getattr(self, name)))
        for key in ("hf_hub_token", "ms_hub_token"):  # the run's record in output_dir never holds a secret
            if sections["model"].get(key):
                sections["model"][key] = "<hidden>"
        sections["training"] = _jsonable(self.training.to_dict())
        return sections


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(values, default=str))


# ----------------------------------------------------------------------------------------------
# Parsing


def training_arguments_class():
    from lathe.train.args.training_args import Seq2SeqTrainingArguments

    return Seq2SeqTrainingArguments


def field_hints(dtype: type) -> dict[str, Any]:
    hints = typing.get_type_hints(dtype)
    return {f.name: hints[f.name] for f in dataclasses.fields(dtype) if f.init}


def parse_train_config(
    source: str | Path | dict | RawConfig, overrides: list[str] | tuple[str, ...] = ()
) -> TrainConfig:
    """Read a LLaMA-Factory-style config (file path or dict) plus command-line overrides into a TrainConfig.

    Precedence: dataclass defaults < file < overrides. `do_train` defaults to True unless the config asks
    for do_eval or do_predict (then, as in LLaMA-Factory, it only evaluates or predicts). A RawConfig is a
    file `lathe train` already read, its overrides applied: it is not read again (nor changed).
    """
    if isinstance(source, RawConfig) and overrides:
        raise TypeError("parse_train_config: a RawConfig already holds its command-line overrides.")
    config_input = source.copy() if isinstance(source, RawConfig) else RawConfig(source, overrides)
    raw, origin, where, path = config_input.values, config_input.origin, config_input.where, config_input.path
    sections = {
        "model": ModelArguments,
        "data": DataArguments,
        "training": training_arguments_class(),
        "finetuning": FinetuningArguments,
        "generating": GeneratingArguments,
    }
    hints = {name: field_hints(dtype) for name, dtype in sections.items()}
    known = {key: hint for section in hints.values() for key, hint in section.items()}
    check_keys(raw, list(known) + list(LAUNCH_KEYS) + list(RAY_KEYS), origin)
    check_ray_keys(raw, origin)
    # read by lathe.llm.launch (torchrun.py, ray_settings.py) before the ranks started (kept for the saved run config)
    launch = {key: raw.pop(key) for key in (*LAUNCH_KEYS, *RAY_KEYS) if key in raw}
    config_input.coerce(known)
    given = {**_jsonable(raw), **_jsonable(launch)}

    _check_stage(raw, origin)
    if not (raw.get("do_eval") or raw.get("do_predict")):
        raw.setdefault("do_train", True)  # a config that asks for nothing trains; with do_eval / do_predict only, not
    overwrite_output_dir = bool(raw.pop("overwrite_output_dir", False))
    _fill_training_defaults(raw)

    built = build_sections(raw, sections, hints, where)
    training = built["training"]
    # lathe's TrainingArguments ignores this transformers-4 key; LLaMA-Factory reads it to decide
    # whether an existing output_dir is resumed (see lathe.llm.workflows) or overwritten.
    training.overwrite_output_dir = overwrite_output_dir

    config = TrainConfig(
        built["model"], built["data"], training, built["finetuning"], built["generating"], source=path, given=given
    )
    _resolve(config)
    _validate(config, where)
    return config


def _check_stage(raw: dict[str, Any], origin) -> None:
    stage = raw.get("stage", "sft")
    if stage not in SUPPORTED_STAGES:
        raise ValueError(
            f"stage {stage!r}{origin('stage')} is not supported yet; lathe trains {', '.join(SUPPORTED_STAGES)}."
        )
    method = raw.get("finetuning_type", "lora")
    if method not in SUPPORTED_FINETUNING_TYPES:
        raise ValueError(
            f"finetuning_type {method!r}{origin('finetuning_type')} is not supported yet; "
            f"lathe supports {', '.join(SUPPORTED_FINETUNING_TYPES)}."
        )


def _fill_training_defaults(raw: dict[str, Any]) -> None:
    """Training values LLaMA-Factory derives from the other sections, set before validation runs."""
    cutoff_len = raw.get("cutoff_len", 2048)
    if raw.get("generation_max_length") is None:
        raw["generation_max_length"] = cutoff_len
    if raw.get("eval_num_beams") is not None:
        raw["generation_num_beams"] = raw["eval_num_beams"]
    # The causal-LM loss chunk by chunk over tokens, logits never whole (lathe.train.loss.chunked): the same
    # loss in a fraction of the memory; models, loss variants and settings it cannot serve run the model's own.
    raw.setdefault("chunked_cross_entropy", "auto")
    # The collators need every column the processors produce (labels, position_ids, ...).
    raw["remove_unused_columns"] = False
    if raw.get("early_stopping_steps") is not None and raw.get("metric_for_best_model") is None:
        raw["metric_for_best_model"] = "eval_loss"  # what early stopping watches unless told otherwise
    if raw.get("finetuning_type", "lora") in ("lora", "oft") and not raw.get("label_names"):
        raw["label_names"] = ["labels"]  # a PeftModel's forward hides `labels` from signature inspection


def _resolve(config: TrainConfig) -> None:
    """Values derived from several sections (LLaMA-Factory does the same after parsing)."""
    model, data, training, finetuning = config.model, config.data, config.training, config.finetuning
    if training.bf16 or finetuning.pure_bf16:
        model.compute_dtype = "bfloat16"
    elif training.fp16:
        model.compute_dtype = "float16"
    model.model_max_length = data.cutoff_len
    model.block_diag_attn = data.neat_packing
    if data.packing is None:
        data.packing = finetuning.stage == "pt"
    # Activation (gradient) checkpointing is on for training unless disable_gradient_checkpointing,
    # as in LLaMA-Factory: the same YAML must fit in the same memory (recomputing activations costs
    # about a third more compute). Models that cannot checkpoint train without it (checkpointing_for).
    if model.disable_gradient_checkpointing:
        training.activation_checkpointing = training.gradient_checkpointing = False
    elif training.do_train:
        training.activation_checkpointing = training.gradient_checkpointing = True
    if training.activation_checkpointing and not training.activation_checkpointing_kwargs:
        kwargs = {"use_reentrant": model.use_reentrant_gc}
        training.activation_checkpointing_kwargs = training.gradient_checkpointing_kwargs = kwargs
    if model.enable_liger_kernel and training.do_train:
        resolve_liger_kernel(finetuning.stage, training)


def _check_output_dir(output_dir: str, where: str) -> None:
    """output_dir is a folder, or can become one: neither it nor a folder above it is an existing file."""
    path = os.path.abspath(output_dir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if os.path.exists(path) and not os.path.isdir(path):
        what = "is an existing file" if path == os.path.abspath(output_dir) else f"is inside {path}, which is a file"
        raise ValueError(f"output_dir {output_dir!r}{where} {what}; it must be a folder (new or existing).")


def _validate(config: TrainConfig, where: str) -> None:
    """Checks across sections, in LLaMA-Factory's order, with the fix in the message."""
    model, data, training, finetuning = config.model, config.data, config.training, config.finetuning
    check_stage_options(data, training, finetuning, where)
    check_grpo_options(data, training, finetuning, config.generating, where)
    if training.do_train and not data.dataset:
        raise ValueError(f"dataset{where} is required for training: name(s) from {data.dataset_dir}/dataset_info.json.")
    _check_output_dir(training.output_dir, where)
    asked = [name for name in ("do_eval", "do_predict", "predict_with_generate") if getattr(training, name)]
    if asked and not data.eval_dataset and data.val_size < 1e-6:
        raise ValueError(
            f"{' and '.join(asked)}{where}: evaluation or prediction needs data: set eval_dataset, or val_size to hold "
            f"out part of the training data."
        )
    if model.adapter_name_or_path is not None and finetuning.finetuning_type not in ("lora", "oft"):
        raise ValueError(
            f"adapter_name_or_path{where} needs finetuning_type: lora or oft (got {finetuning.finetuning_type!r})."
        )
    check_quantized_training(model, finetuning, training, where)
    if training.fp16 and finetuning.pure_bf16:
        raise ValueError(f"fp16 and pure_bf16{where} contradict each other.")
    validate_methods(config, where)
    if finetuning.early_stopping_steps is not None:
        if finetuning.early_stopping_steps <= 0:
            raise ValueError(f"early_stopping_steps{where} must be a positive number of evaluations.")
        if getattr(training.eval_strategy, "value", training.eval_strategy) == "no":
            raise ValueError(f"early_stopping_steps{where} counts evaluations: set eval_strategy to steps or epoch.")
