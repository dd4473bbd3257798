"""The first fields of TrainingArguments (training_args.py), in transformers' order: where a run writes, how long
it trains, the learning rate and its schedule, the optimizer, the step maths, precision and memory; and
the helpers every field definition uses."""

from dataclasses import dataclass, field

from lathe.train.args.enums import OptimizerNames, SchedulerType

# transformers marks `bool | None` flags this way so that a bare `--flag` on the command line means True.
BARE_FLAG_IS_TRUE = {"nargs": "?", "const": True}


def help_text(text: str, **extra) -> dict:
    return {"help": text, **extra}


def deprecated(replacement: str | None, text: str) -> dict:
    # `replacement` names the field that took over, or None when the value is ignored;
    # the argument parser reads this key to list the option under "deprecated".
    return {"help": text, "deprecated": replacement}


@dataclass(repr=False)  # TrainingArguments prints itself (args_derived.DerivedValues.__str__)
class CoreArguments:
    """Inherited by TrainingArguments, whose fields these are (output_dir first, so that
    TrainingArguments("out") names the output folder, as in transformers)."""

    # --- Output ---
    output_dir: str | None = field(
        default=None, metadata=help_text("Directory for checkpoints and predictions; defaults to 'trainer_output'.")
    )

    # --- Training length and batch size ---
    per_device_train_batch_size: int = field(default=8, metadata=help_text("Training batch size per device."))
    num_train_epochs: float = field(
        default=3.0,
        metadata=help_text("Number of passes over the training set; a fraction stops part-way through the last one."),
    )
    max_steps: int = field(
        default=-1,
        metadata=help_text(
            "Total number of optimizer steps; when positive it overrides num_train_epochs."
            " Required for datasets without a length."
        ),
    )

    # --- Learning rate and schedule ---
    learning_rate: float = field(default=5e-5, metadata=help_text("Peak learning rate, reached at the end of warmup."))
    lr_scheduler_type: SchedulerType | str = field(
        default="linear", metadata=help_text(f"Learning-rate schedule, one of {SchedulerType.values()}.")
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default=None,
        metadata=help_text("Extra keyword arguments for the schedule, as a dict or a JSON object string."),
    )
    warmup_steps: float = field(
        default=0,
        metadata=help_text(
            "Linear warmup length: a whole number of steps, or a float in [0, 1) read as a fraction of all training steps."
        ),
    )

    # --- Optimizer ---
    optim: OptimizerNames | str = field(
        default="adamw_torch_fused",
        metadata=help_text(
            "Optimizer name; lathe builds adamw_torch, adamw_torch_fused, sgd, adagrad, rmsprop, adafactor, galore_* and apollo_*."
        ),
    )
    optim_args: str | None = field(
        default=None,
        metadata=help_text("Extra optimizer arguments as a 'key=value,key=value' string."),
    )
    optim_target_modules: str | list[str] | None = field(
        default=None,
        metadata=help_text(
            "GaLore / APOLLO optimizers: the nn.Linear modules they project, as names, a regex or 'all-linear'."
        ),
    )
    weight_decay: float = field(
        default=0.0,
        metadata=help_text("Decoupled weight decay, applied to every parameter except biases and norm weights."),
    )
    adam_beta1: float = field(default=0.9, metadata=help_text("Adam's decay rate for the running mean of gradients."))
    adam_beta2: float = field(
        default=0.999, metadata=help_text("Adam's decay rate for the running mean of squared gradients.")
    )
    adam_epsilon: float = field(
        default=1e-8, metadata=help_text("Adam's epsilon, added to the denominator for stability.")
    )

    # --- Step maths and stability ---
    gradient_accumulation_steps: int = field(
        default=1,
        metadata=help_text(
            "Number of micro-batches whose gradients are summed before one optimizer step; steps count optimizer updates."
        ),
    )
    average_tokens_across_devices: bool = field(
        default=True,
        metadata=help_text(
            "Sum the token count of a step over all processes so the loss is normalised by the global number of tokens."
        ),
    )
    max_grad_norm: float = field(
        default=1.0, metadata=help_text("Clip the total gradient norm to this value; 0 disables clipping.")
    )
    label_smoothing_factor: float = field(
        default=0.0, metadata=help_text("Label smoothing for the cross-entropy loss; 0 means none.")
    )

    # --- Mixed precision ---
    bf16: bool = field(default=False, metadata=help_text("Train with bfloat16 autocast (weights stay in float32)."))
    fp16: bool = field(default=False, metadata=help_text("Train with float16 autocast and loss scaling."))
    bf16_full_eval: bool = field(default=False, metadata=help_text("Evaluate with the model cast to bfloat16."))
    fp16_full_eval: bool = field(default=False, metadata=help_text("Evaluate with the model cast to float16."))
    tf32: bool | None = field(
        default=None,
        metadata=help_text("Allow TF32 matrix multiplies on Ampere or newer GPUs; None leaves torch's setting alone."),
    )

    # --- Activation checkpointing ---
    activation_checkpointing: bool | None = field(
        default=None,
        metadata=help_text(
            "Recompute activations in the backward pass to save memory at the cost of speed.", **BARE_FLAG_IS_TRUE
        ),
    )
    activation_checkpointing_kwargs: dict | str | None = field(
        default=None,
        metadata=help_text(
            "Keyword arguments for the model's gradient_checkpointing_enable(), as a dict or JSON string."
        ),
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={
            **deprecated("activation_checkpointing", "Old name of activation_checkpointing; it mirrors that field."),
            **BARE_FLAG_IS_TRUE,
        },
    )
    gradient_checkpointing_kwargs: dict | str | None = field(
        default=None,
        metadata=deprecated(
            "activation_checkpointing_kwargs", "Old name of activation_checkpointing_kwargs; it mirrors that field."
        ),
    )

    # --- Compilation and memory ---
    torch_compile: bool = field(default=False, metadata=help_text("Wrap the model with torch.compile()."))
    torch_compile_backend: str | None = field(
        default=None, metadata=help_text("Backend for torch.compile(); setting it turns torch_compile on.")
    )
    torch_compile_mode: str | None = field(
        default=None, metadata=help_text("Mode for torch.compile(); setting it turns torch_compile on.")
    )
    use_cache: bool = field(
        default=False, metadata=help_text("Leave the model's key/value cache on during training (rarely needed).")
    )
    neftune_noise_alpha: float | None = field(
        default=None,
        metadata=help_text("Scale of the NEFTune noise added to input embeddings during training; None disables it."),
    )
    torch_empty_cache_steps: int | None = field(
        default=None, metadata=help_text("Empty the accelerator's memory cache every this many steps; None never does.")
    )
    auto_find_batch_size: bool = field(
        default=False,
        metadata=help_text("Halve the training batch size and retry whenever a step runs out of accelerator memory."),
    )
