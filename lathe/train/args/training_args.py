"""TrainingArguments: every training option with its HF name, default and help, in one table (the fields of
Seq2SeqTrainingArguments after it). What the class does with them lives beside it: derived.py the values
computed from them (device, ranks, batch sizes, JSON), validation.py the checks run at construction,
setters.py the set_* methods, integrations.py the Hub / debug / accelerate types and their checks."""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lathe.train.args.derived import DerivedValues
from lathe.train.args.enums import ExplicitEnum, IntervalStrategy, OptimizerNames, SaveStrategy, SchedulerType
from lathe.train.args.integrations import (
    AcceleratorConfig,
    DebugOption,
    HubStrategy,
    IntegrationProperties,
    ParallelMode,
)
from lathe.train.args.setters import FluentSetters
from lathe.train.args.validation import LOG_LEVELS, normalize_and_validate

__all__ = [
    "AcceleratorConfig",
    "DebugOption",
    "ExplicitEnum",
    "HubStrategy",
    "IntervalStrategy",
    "OptimizerNames",
    "ParallelMode",
    "SaveStrategy",
    "SchedulerType",
    "Seq2SeqTrainingArguments",
    "TrainingArguments",
    "default_logging_dir",
]


# transformers marks `bool | None` flags this way so that a bare `--flag` on the command line means True.
_BARE_FLAG_IS_TRUE = {"nargs": "?", "const": True}


def _help(text: str, **extra) -> dict:
    return {"help": text, **extra}


def _deprecated(replacement: str | None, text: str) -> dict:
    # `replacement` names the field that took over, or None when the value is ignored;
    # the argument parser reads this key to list the option under "deprecated".
    return {"help": text, "deprecated": replacement}


@dataclass(repr=False)  # printed by DerivedValues.__str__ (sorted fields), as before the split
class TrainingArguments(FluentSetters, DerivedValues, IntegrationProperties):
    """The options of `Trainer`, with transformers 5.23's names and defaults, output_dir first (so that
    TrainingArguments("out") names the output folder, as in transformers). The mixins hold behaviour, no fields.

    Validation happens once, in `__post_init__` (see validation.py): numeric and boolean fields
    hold their type (strings converted as HfArgumentParser converts them, see coercion.py), strategy
    fields become enums, defaults that depend on other fields are filled in (`eval_steps`, `metric_for_best_model`,
    `greater_is_better`, `report_to`), and contradictory settings raise a ValueError naming the
    field. Device and rank properties never change the process: `lathe.train.runtime` acts on them.
    """

    # --- Output ---
    output_dir: str | None = field(
        default=None, metadata=_help("Directory for checkpoints and predictions; defaults to 'trainer_output'.")
    )

    # --- Training length and batch size ---
    per_device_train_batch_size: int = field(default=8, metadata=_help("Training batch size per device."))
    num_train_epochs: float = field(
        default=3.0,
        metadata=_help("Number of passes over the training set; a fraction stops part-way through the last one."),
    )
    max_steps: int = field(
        default=-1,
        metadata=_help(
            "Total number of optimizer steps; when positive it overrides num_train_epochs."
            " Required for datasets without a length."
        ),
    )

    # --- Learning rate and schedule ---
    learning_rate: float = field(default=5e-5, metadata=_help("Peak learning rate, reached at the end of warmup."))
    lr_scheduler_type: SchedulerType | str = field(
        default="linear", metadata=_help(f"Learning-rate schedule, one of {SchedulerType.values()}.")
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default=None,
        metadata=_help("Extra keyword arguments for the schedule, as a dict or a JSON object string."),
    )
    warmup_steps: float = field(
        default=0,
        metadata=_help(
            "Linear warmup length: a whole number of steps, or a float in [0, 1) read as a fraction of all training steps."
        ),
    )

    # --- Optimizer ---
    optim: OptimizerNames | str = field(
        default="adamw_torch_fused",
        metadata=_help(
            "Optimizer name; lathe builds adamw_torch, adamw_torch_fused, sgd, adagrad, rmsprop, adafactor, galore_* and apollo_*."
        ),
    )
    optim_args: str | None = field(
        default=None,
        metadata=_help("Extra optimizer arguments as a 'key=value,key=value' string."),
    )
    optim_target_modules: str | list[str] | None = field(
        default=None,
        metadata=_help(
            "GaLore / APOLLO optimizers: the nn.Linear modules they project, as names, a regex or 'all-linear'."
        ),
    )
    weight_decay: float = field(
        default=0.0,
        metadata=_help("Decoupled weight decay, applied to every parameter except biases and norm weights."),
    )
    adam_beta1: float = field(default=0.9, metadata=_help("Adam's decay rate for the running mean of gradients."))
    adam_beta2: float = field(
        default=0.999, metadata=_help("Adam's decay rate for the running mean of squared gradients.")
    )
    adam_epsilon: float = field(default=1e-8, metadata=_help("Adam's epsilon, added to the denominator for stability."))

    # --- Step maths and stability ---
    gradient_accumulation_steps: int = field(
        default=1,
        metadata=_help(
            "Number of micro-batches whose gradients are summed before one optimizer step; steps count optimizer updates."
        ),
    )
    average_tokens_across_devices: bool = field(
        default=True,
        metadata=_help(
            "Sum the token count of a step over all processes so the loss is normalised by the global number of tokens."
        ),
    )
    max_grad_norm: float = field(
        default=1.0, metadata=_help("Clip the total gradient norm to this value; 0 disables clipping.")
    )
    label_smoothing_factor: float = field(
        default=0.0, metadata=_help("Label smoothing for the cross-entropy loss; 0 means none.")
    )

    # --- Mixed precision ---
    bf16: bool = field(default=False, metadata=_help("Train with bfloat16 autocast (weights stay in float32)."))
    fp16: bool = field(default=False, metadata=_help("Train with float16 autocast and loss scaling."))
    bf16_full_eval: bool = field(default=False, metadata=_help("Evaluate with the model cast to bfloat16."))
    fp16_full_eval: bool = field(default=False, metadata=_help("Evaluate with the model cast to float16."))
    tf32: bool | None = field(
        default=None,
        metadata=_help("Allow TF32 matrix multiplies on Ampere or newer GPUs; None leaves torch's setting alone."),
    )

    # --- Activation checkpointing ---
    activation_checkpointing: bool | None = field(
        default=None,
        metadata=_help(
            "Recompute activations in the backward pass to save memory at the cost of speed.", **_BARE_FLAG_IS_TRUE
        ),
    )
    activation_checkpointing_kwargs: dict | str | None = field(
        default=None,
        metadata=_help("Keyword arguments for the model's gradient_checkpointing_enable(), as a dict or JSON string."),
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={
            **_deprecated("activation_checkpointing", "Old name of activation_checkpointing; it mirrors that field."),
            **_BARE_FLAG_IS_TRUE,
        },
    )
    gradient_checkpointing_kwargs: dict | str | None = field(
        default=None,
        metadata=_deprecated(
            "activation_checkpointing_kwargs", "Old name of activation_checkpointing_kwargs; it mirrors that field."
        ),
    )

    # --- Compilation and memory ---
    torch_compile: bool = field(default=False, metadata=_help("Wrap the model with torch.compile()."))
    torch_compile_backend: str | None = field(
        default=None, metadata=_help("Backend for torch.compile(); setting it turns torch_compile on.")
    )
    torch_compile_mode: str | None = field(
        default=None, metadata=_help("Mode for torch.compile(); setting it turns torch_compile on.")
    )
    use_cache: bool = field(
        default=False, metadata=_help("Leave the model's key/value cache on during training (rarely needed).")
    )
    neftune_noise_alpha: float | None = field(
        default=None,
        metadata=_help("Scale of the NEFTune noise added to input embeddings during training; None disables it."),
    )
    torch_empty_cache_steps: int | None = field(
        default=None, metadata=_help("Empty the accelerator's memory cache every this many steps; None never does.")
    )
    auto_find_batch_size: bool = field(
        default=False,
        metadata=_help("Halve the training batch size and retry whenever a step runs out of accelerator memory."),
    )

    # --- Hub: used only by push_to_hub, which lathe refuses (offline) ---
    hub_model_id: str | None = field(default=None, metadata=_help("Hub repository to push to (push_to_hub only)."))
    hub_strategy: HubStrategy | str = field(
        default="every_save", metadata=_help(f"What push_to_hub pushes when, one of {HubStrategy.values()}.")
    )
    hub_token: str | None = field(default=None, metadata=_help("Hub token for push_to_hub."))
    hub_private_repo: bool | None = field(default=None, metadata=_help("Make the pushed repository private."))
    hub_always_push: bool = field(default=False, metadata=_help("Push even while the previous push runs."))
    hub_revision: str | None = field(default=None, metadata=_help("Branch or revision to push to."))

    # --- Debugging ---
    debug: str | list[DebugOption] = field(
        default="",
        metadata=_help(
            "Debug modes, space separated: 'underflow_overflow' stops training at the first inf/nan in a module's "
            "weights, inputs or outputs and prints the frames before it; 'tpu_metrics_debug' needs a TPU."
        ),
    )

    # --- accelerate (lathe's own loop does what these describe) ---
    accelerator_config: dict | str | None = field(
        default=None,
        metadata=_help("AcceleratorConfig as a dict, a JSON string or a JSON file; see AcceleratorConfig."),
    )
    parallelism_config: Any | None = field(
        default=None, metadata=_help("accelerate's ParallelismConfig (tensor/context parallelism): not supported.")
    )

    # --- Kernels and fault tolerance ---
    # use_liger_kernel / liger_kernel_config are validated in integrations.py; what they do is chosen in
    # lathe.train.loss.causal_lm: Liger where installed and on a CUDA device, else the chunked cross-entropy.
    use_liger_kernel: bool = field(
        default=False,
        metadata=_help(
            "Patch the model with Liger's fused kernels where Liger-Kernel is installed and a CUDA device is used; "
            "elsewhere the causal-LM loss runs as lathe's chunked cross-entropy. The log says which."
        ),
    )
    liger_kernel_config: dict[str, bool] | None = field(
        default=None, metadata=_help("Which Liger kernels to apply, e.g. {'rms_norm': True, 'rope': False}.")
    )
    enable_jit_checkpoint: bool = field(
        default=False,
        metadata=_help("On SIGTERM, finish the current step, save a checkpoint and stop (pre-emptible jobs)."),
    )

    # --- Trackers ---
    project: str = field(default="huggingface", metadata=_help("Project name for the trackio reporter."))
    trackio_space_id: str | None = field(default=None, metadata=_help("Hub Space for trackio: not supported."))
    trackio_bucket_id: str | None = field(default=None, metadata=_help("Hub bucket for trackio: not supported."))
    trackio_static_space_id: str | None | Literal[False] = field(
        default=None, metadata=_help("Static Hub Space for trackio: not supported.")
    )

    # --- Logging ---
    logging_strategy: IntervalStrategy | str = field(
        default="steps", metadata=_help("When to log training metrics: 'no', 'steps' or 'epoch'.")
    )
    logging_steps: float = field(
        default=500,
        metadata=_help(
            "Log every this many steps: a whole number, or a float in (0, 1) read as a fraction of all steps."
        ),
    )
    logging_first_step: bool = field(default=False, metadata=_help("Also log after the very first step."))
    log_on_each_node: bool = field(
        default=True, metadata=_help("In multi-node runs, log from the main process of every node, not only node 0.")
    )
    logging_nan_inf_filter: bool = field(
        default=True,
        metadata=_help("Leave NaN and infinite step losses out of the logged average; gradients are unaffected."),
    )
    include_num_input_tokens_seen: str | bool = field(
        default="no",
        metadata=_help("Count input tokens seen: 'no', 'all', or 'non_padding'; True means 'all', False 'no'."),
    )
    log_level: str = field(
        default="passive",
        metadata=_help(
            "Log level of the main process; 'passive' keeps the application's level.", choices=list(LOG_LEVELS)
        ),
    )
    log_level_replica: str = field(
        default="warning",
        metadata=_help(
            "Log level of the other processes, with the same choices as log_level.", choices=list(LOG_LEVELS)
        ),
    )
    disable_tqdm: bool | None = field(
        default=None,
        metadata=_help("Hide progress bars; by default they are hidden when the log level is above warning."),
    )
    report_to: None | str | list[str] = field(
        default="none",
        metadata=_help(
            "Where to send logs: a list of 'jsonl' and 'tensorboard', 'all' for every installed one, or 'none'."
        ),
    )
    run_name: str | None = field(default=None, metadata=_help("A name for this run, shown by the reporters."))

    # --- Evaluation ---
    eval_strategy: IntervalStrategy | str = field(
        default="no", metadata=_help("When to evaluate during training: 'no', 'steps' or 'epoch'.")
    )
    eval_steps: float | None = field(
        default=None,
        metadata=_help(
            "Evaluate every this many steps (a whole number or a fraction of all steps); defaults to logging_steps."
        ),
    )
    eval_delay: float = field(
        default=0, metadata=_help("Epochs or steps (following eval_strategy) to wait before the first evaluation.")
    )
    per_device_eval_batch_size: int = field(default=8, metadata=_help("Evaluation batch size per device."))
    prediction_loss_only: bool = field(
        default=False, metadata=_help("Return only the loss from evaluation and prediction, not logits or labels.")
    )
    eval_on_start: bool = field(
        default=False, metadata=_help("Evaluate once before the first training step as a sanity check.")
    )
    eval_do_concat_batches: bool = field(
        default=True,
        metadata=_help("Concatenate predictions across batches; False keeps a list with one entry per batch."),
    )
    eval_use_gather_object: bool = field(
        default=False, metadata=_help("Gather non-tensor evaluation outputs from every process with gather_object.")
    )
    eval_accumulation_steps: int | None = field(
        default=None,
        metadata=_help("Move predictions to the CPU every this many evaluation steps; None keeps them on the device."),
    )
    include_for_metrics: list[str] = field(
        default_factory=list,
        metadata=_help("Extra data handed to compute_metrics: any of 'inputs' and 'loss'."),
    )
    batch_eval_metrics: bool = field(
        default=False, metadata=_help("Call compute_metrics after every batch instead of once on all predictions.")
    )

    # --- Checkpoints ---
    save_only_model: bool = field(
        default=False, metadata=_help("Save only the weights, without optimizer, scheduler or RNG state (no resume).")
    )
    save_strategy: SaveStrategy | str = field(
        default="steps", metadata=_help("When to save a checkpoint: 'no', 'steps', 'epoch' or 'best'.")
    )
    save_steps: float = field(
        default=500,
        metadata=_help(
            "Save every this many steps: a whole number, or a float in (0, 1) read as a fraction of all steps."
        ),
    )
    save_on_each_node: bool = field(
        default=False, metadata=_help("In multi-node runs, save on every node (for storage that is not shared).")
    )
    save_total_limit: int | None = field(
        default=None,
        metadata=_help("Keep at most this many checkpoints, deleting the oldest; the best one is always kept."),
    )
    push_to_hub: bool = field(
        default=False, metadata=_help("Not supported: lathe works offline, so this must stay False.")
    )

    # --- Best model ---
    load_best_model_at_end: bool = field(
        default=False,
        metadata=_help("Reload the best checkpoint when training ends; needs matching eval and save strategies."),
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata=_help("Metric that ranks checkpoints, with or without the 'eval_' prefix; defaults to 'loss'."),
    )
    greater_is_better: bool | None = field(
        default=None,
        metadata=_help("Whether a larger metric is better; by default False for names ending in 'loss', else True."),
    )

    # --- Resuming ---
    ignore_data_skip: bool = field(
        default=False,
        metadata=_help("On resume, start from the beginning of the data instead of skipping the batches already seen."),
    )
    restore_callback_states_from_checkpoint: bool = field(
        default=False, metadata=_help("On resume, restore stateful callbacks from the checkpoint.")
    )

    # --- Reproducibility ---
    full_determinism: bool = field(
        default=False, metadata=_help("Use deterministic algorithms everywhere (slower; for debugging).")
    )
    seed: int = field(default=42, metadata=_help("Random seed set at the start of training."))
    data_seed: int | None = field(default=None, metadata=_help("Seed for the data samplers; defaults to seed."))

    # --- Hardware ---
    use_cpu: bool = field(default=False, metadata=_help("Run on the CPU even when an accelerator is available."))

    # --- Data loading ---
    dataloader_drop_last: bool = field(default=False, metadata=_help("Drop the last incomplete batch."))
    dataloader_num_workers: int = field(
        default=0, metadata=_help("Worker processes for data loading; 0 loads in the main process.")
    )
    dataloader_pin_memory: bool = field(
        default=True, metadata=_help("Pin batches in page-locked memory for faster copies.")
    )
    dataloader_persistent_workers: bool = field(
        default=False, metadata=_help("Keep data-loading workers alive between epochs.")
    )
    dataloader_prefetch_factor: int | None = field(
        default=None, metadata=_help("Batches each worker loads ahead; needs dataloader_num_workers > 0.")
    )
    dataloader_multiprocessing_context: str | None = field(
        default=None,
        metadata=_help(
            "Start method of data-loading workers: 'fork', 'spawn' or 'forkserver'.",
            choices=["fork", "spawn", "forkserver"],
        ),
    )
    dataloader_in_order: bool = field(
        default=True, metadata=_help("Yield batches in dispatch order; False yields them as soon as a worker is done.")
    )
    remove_unused_columns: bool = field(
        default=True, metadata=_help("Drop dataset columns that the model's forward() does not accept.")
    )
    label_names: list[str] | None = field(
        default=None, metadata=_help("Keys of the input dict that hold labels; by default any key containing 'label'.")
    )
    train_sampling_strategy: str = field(
        default="random",
        metadata=_help(
            "Order of training samples: 'random', 'sequential', 'group_by_length' or 'batch_rebalance'.",
            choices=["random", "sequential", "group_by_length", "batch_rebalance"],
        ),
    )
    length_column_name: str = field(
        default="length", metadata=_help("Column with precomputed sample lengths, used when grouping by length.")
    )

    # --- Distributed (DistributedDataParallel, FSDP) ---
    ddp_find_unused_parameters: bool | None = field(
        default=None, metadata=_help("find_unused_parameters passed to DistributedDataParallel.")
    )
    ddp_bucket_cap_mb: int | None = field(
        default=None, metadata=_help("bucket_cap_mb passed to DistributedDataParallel.")
    )
    ddp_broadcast_buffers: bool | None = field(
        default=None, metadata=_help("broadcast_buffers passed to DistributedDataParallel.")
    )
    ddp_static_graph: bool | None = field(
        default=None, metadata=_help("static_graph passed to DistributedDataParallel.")
    )
    ddp_backend: str | None = field(
        default=None,
        metadata=_help(
            "Backend of the process group, such as 'nccl' or 'gloo'.",
            choices=["nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl"],
        ),
    )
    ddp_timeout: int = field(default=1800, metadata=_help("Timeout in seconds for collective operations."))
    fsdp: str | None = field(
        default=None,
        metadata=_help("Shard the model with FSDP; True, or transformers' legacy option string.", **_BARE_FLAG_IS_TRUE),
    )
    fsdp_config: dict | str | None = field(
        default=None, metadata=_help("FSDP settings as a dict, a JSON string or the path of a JSON file.")
    )
    deepspeed: dict | str | None = field(
        default=None, metadata=_help("DeepSpeed configuration as a dict or the path of a JSON file.")
    )
    skip_memory_metrics: bool = field(
        default=True, metadata=_help("Skip adding memory-usage reports to the metrics (they slow training down).")
    )
    chunked_cross_entropy: str | bool = field(
        default="no",
        metadata=_help(
            "Compute a transformers causal LM's loss with its LM head, chunk by chunk over tokens, so the "
            "full-vocabulary logits never exist (same loss and gradients, a fraction of the memory). 'no': the "
            "model's own loss; 'auto': chunked where the model, compute_loss_func and torch_compile allow it, "
            "else the model's own loss (logged); 'yes' (True): chunked, or an error saying why not. "
            "lathe extension (not in transformers).",
            choices=["no", "auto", "yes"],
        ),
    )
    chunked_cross_entropy_size: int | None = field(
        default=None,
        metadata=_help(
            "Tokens per chunk of chunked_cross_entropy; None: about 2**25 / vocab_size (256 for a 151,936 "
            "vocabulary). lathe extension."
        ),
    )

    # --- Flags for scripts (the Trainer does not read them) ---
    do_train: bool = field(default=False, metadata=_help("Whether a script should run training."))
    do_eval: bool = field(
        default=False, metadata=_help("Whether a script should run evaluation; set when eval_strategy is not 'no'.")
    )
    do_predict: bool = field(default=False, metadata=_help("Whether a script should run prediction on the test set."))
    resume_from_checkpoint: str | None = field(
        default=None, metadata=_help("Checkpoint folder a script should resume from.")
    )
    local_rank: int = field(
        default=-1, metadata=_help("Local rank passed by old launchers; prefer the local_process_index property.")
    )
    past_index: int = field(
        default=-1,
        metadata=_help(
            "Removed in transformers 5 (a model output fed back as memory, e.g. Transformer-XL's mems); must stay -1."
        ),
    )

    # --- Removed in transformers 5, still accepted with a FutureWarning ---
    warmup_ratio: float | None = field(
        default=None, metadata=_deprecated("warmup_steps", "Fraction of steps used for warmup; use warmup_steps < 1.")
    )
    evaluation_strategy: IntervalStrategy | str | None = field(
        default=None, metadata=_deprecated("eval_strategy", "Old name of eval_strategy.")
    )
    group_by_length: bool | None = field(
        default=None,
        metadata=_deprecated(
            "train_sampling_strategy", "Group samples of similar length; use train_sampling_strategy='group_by_length'."
        ),
    )
    logging_dir: str | None = field(
        default=None,
        metadata=_deprecated(
            None, "TensorBoard log directory; lathe still honours it. By default <output_dir>/runs/<time>_<host>."
        ),
    )
    overwrite_output_dir: bool | None = field(
        default=None, metadata=_deprecated(None, "Ignored: checkpoints in output_dir are always overwritten.")
    )
    save_safetensors: bool | None = field(
        default=None, metadata=_deprecated(None, "Ignored: weights are always saved as safetensors.")
    )
    no_cuda: bool | None = field(default=None, metadata=_deprecated("use_cpu", "Old name of use_cpu."))

    # the dict fields the command line gives as JSON (transformers' list)
    _VALID_DICT_FIELDS = [
        "accelerator_config",
        "fsdp_config",
        "deepspeed",
        "gradient_checkpointing_kwargs",
        "lr_scheduler_kwargs",
    ]

    def __post_init__(self):
        normalize_and_validate(self)


@dataclass(repr=False)  # keep the parent's sorted __str__/__repr__ instead of a generated repr
class Seq2SeqTrainingArguments(TrainingArguments):
    """TrainingArguments plus the generation options of `Seq2SeqTrainer`."""

    sortish_sampler: bool = field(
        default=False, metadata=_help("Sort training samples by length within random chunks to reduce padding.")
    )
    predict_with_generate: bool = field(
        default=False,
        metadata=_help("Evaluate and predict with generate(), so metrics like ROUGE or BLEU can be computed."),
    )
    generation_max_length: int | None = field(
        default=None, metadata=_help("max_length for generate() during evaluation; defaults to the model's setting.")
    )
    generation_num_beams: int | None = field(
        default=None, metadata=_help("num_beams for generate() during evaluation; defaults to the model's setting.")
    )
    generation_config: str | Path | None = field(
        default=None,
        metadata=_help("A GenerationConfig, or the folder or model id to load one from, used during prediction."),
    )


def default_logging_dir(output_dir: str) -> str:
    """Where the TensorBoard reporter writes when `logging_dir` is unset: <output_dir>/runs/<time>_<host>,
    the same layout as torch's SummaryWriter. Call it once per run: the name carries the start time."""
    import socket
    from datetime import datetime

    stamp = datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join(output_dir, "runs", f"{stamp}_{socket.gethostname()}")
