"""The memory plan: the expected peak memory per device of a causal-LM training step (weights,
gradients, optimizer state, activations, logits) from the model's shape and the run's settings, and
whether it fits the device. docs/MEMORY.md explains each term and its measured accuracy."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from lathe.llm.memory.layers import PROJECTIONS, LayerMethod, layer_index, layer_methods, lm_head_trains
from lathe.llm.memory.precision import autocast_weight_copies
from lathe.llm.memory.preference import (
    PREFERENCE_STAGES,
    lm_logits_bytes,
    log_prob_bytes,
    preference_peak,
    reference_bytes,
    rm_loss_path,
    rows_per_forward,
    unused_head_bytes,
    value_head_activations,
)
from lathe.llm.memory.sharding import shard_plan
from lathe.llm.memory.sizes import logits_bytes, packed_bytes, quantized_bytes

__all__ = ["MemoryPlan", "Settings", "estimate_memory", "fill_batch_terms"]

logger = logging.getLogger(__name__)

MIB = 2**20
BATCH_LIMIT = 4096  # the largest batch the fit search tries
# Optimizer state bytes per trainable parameter element: Adam's two moments in the parameter's dtype.
EIGHT_BIT_OPTIMIZERS = ("8bit",)
STATELESS_OPTIMIZERS = ("sgd", "adafactor")


@dataclass
class Shape:
    """What the activations depend on: a decoder's sizes, from its config."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int


@dataclass
class MemoryPlan:
    weights: int
    gradients: int
    optimizer: int
    activations: int  # saved for backward, with the run's checkpointing setting
    activations_other: int  # the same with gradient checkpointing switched the other way
    logits: int  # what the loss holds at its peak: full-vocabulary logits, or one chunk's
    optimizer_step: int  # the optimizer's temporaries during step()
    peak: int
    batch_size: int  # per device
    seq_len: int
    checkpointing: bool
    loss_path: str
    device: str
    available: int | None  # free memory of the device (None: unknown)
    largest_batch: int | None = None  # the largest per-device batch the plan says fits
    notes: list[str] = field(default_factory=list)
    reference: int = 0  # dpo / kto: a frozen reference copy's weights
    stage: str = "sft"
    gathered: int = 0  # FSDP2 / ZeRO-3: parameters (and gradients) held whole while computing
    buckets: int = 0  # DDP: its gradient buckets
    generation: int = 0  # grpo: sampling's KV cache and next-token scores (lathe.llm.memory.grpo)

    @property
    def fits(self) -> bool:
        return self.available is None or self.peak <= self.available


def model_shape(model) -> Shape | None:
    """The decoder's sizes, or None for a model without a transformers decoder config."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    try:
        hidden, layers = int(config.hidden_size), int(config.num_hidden_layers)
        heads, vocab = int(config.num_attention_heads), int(config.vocab_size)
    except (AttributeError, TypeError):
        return None
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    if isinstance(intermediate, (list, tuple)):  # one per layer (Gemma 3n): the widest bounds each layer's peak
        intermediate = max(intermediate)
    return Shape(hidden, int(intermediate), heads, kv_heads, head_dim, layers, vocab)


def _norm(shape: Shape, trained: bool, outputs_saved: int, wide: int = 1) -> int:
    # RMSNorm: x and rsqrt(mean(x^2)) for the input's gradient, x*rsqrt for the weight's (float32 even under
    # half precision: `wide` elements each), the output for the next matmuls (autocast: one copy each).
    return (shape.hidden + 1 + (shape.hidden if trained else 0)) * wide + shape.hidden * outputs_saved


def _layer_elements(shape: Shape, layer: LayerMethod, seq_len: int, masked: bool, eager: bool, wide: int) -> int:
    """Elements per token one decoder layer saves for backward (Llama-family layout, measured layout of
    transformers 5 with sdpa or eager attention)."""
    kv, inter = shape.kv_heads * shape.head_dim, shape.intermediate
    q = shape.heads * shape.head_dim
    saves, copies = layer.saves_input, len if wide > 1 and layer.norms_trained else bool  # float32 norm outputs
    elements = _norm(shape, layer.norms_trained, copies(saves & {"q_proj", "k_proj", "v_proj"}), wide)
    elements += _norm(shape, layer.norms_trained, copies(saves & {"gate_proj", "up_proj"}), wide)
    if eager:  # q, repeated k and v, the probabilities, the output made contiguous for o_proj
        elements += 3 * q + shape.heads * seq_len + q
    else:  # sdpa: q, k, v (repeated to every head when a mask is passed), output, log-sum-exp
        elements += q + 2 * (q if masked else kv) + q + shape.heads
    elements += 3 * inter + (inter if "down_proj" in saves else 0)  # gate, silu(gate), up; down's input
    elements += sum(layer.lora_rank.values())  # lora_B keeps lora_A's output
    # A LoRA dropout's output (kept by lora_A) and its mask (one byte per element, counted as a quarter).
    elements += layer.dropout_inputs + layer.dropout_inputs // 4
    return elements


def activation_bytes(
    model, shape: Shape, batch: int, seq_len: int, element: int, checkpointing: bool, masked: bool
) -> tuple[int, int]:
    """(what the forward keeps for backward, what one layer's recomputation adds during backward), per
    device; logits excluded (see logits_bytes). Without checkpointing nothing is recomputed."""
    methods, embeddings, head = layer_methods(model, shape.layers)
    head = head or lm_head_trains(model)  # a head tied to the embeddings is named after them
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    eager = attention == "eager"
    wide = 4 // element  # a float32 tensor in `element`-sized units (2 under half precision)
    first = 0 if embeddings else next((i for i, layer in enumerate(methods) if layer.trained), shape.layers)
    # Layers below the first trained one need no backward; from there on every layer passes gradients down.
    per_layer = []
    for index, layer in enumerate(methods):
        if index >= first and not layer.trained:
            layer = LayerMethod(trained=True)  # frozen, but its input gradient is needed
        per_layer.append(_layer_elements(shape, layer, seq_len, masked, eager, wide) if index >= first else 0)
    flowing = shape.layers - first
    recompute = 0
    if checkpointing and flowing:
        layers_total, recompute = flowing * shape.hidden, max(per_layer)  # each layer's input; one layer again
    else:
        layers_total = sum(per_layer)
    # The final norm, the rotary cos / sin (float32).
    outside = (_norm(shape, head, head, wide) if flowing or head else 0) + 2 * shape.head_dim * wide
    tokens = batch * seq_len
    mask = batch * seq_len * seq_len * element if masked and not eager else 0
    return tokens * (layers_total + outside) * element + mask, tokens * recompute * element


def parameter_bytes(model, quantization_bit: int | None = None, double_quant: bool = True) -> tuple[int, int, int]:
    """(weight bytes, trainable elements, trainable bytes). A base to be quantized while loading (a plan
    made on the meta device before quantization) counts its decoder linears at quantization_bit."""
    import torch

    quantized = {}
    if quantization_bit:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and layer_index(name + ".") is not None and "lora_" not in name:
                plain = name.replace(".base_layer", "") + ".weight"
                quantized[plain] = quantized_bytes(module, quantization_bit, double_quant)
    weights = trainable = trainable_bytes = 0
    for name, param in model.named_parameters():
        size = param.numel() * param.element_size()
        plain = name.replace(".base_layer", "")
        is_packed = param.dtype in (torch.uint8, torch.int8)  # already quantized by bitsandbytes
        weights += quantized.get(plain, size) if not is_packed else packed_bytes(param)
        if param.requires_grad:
            trainable += param.numel()
            trainable_bytes += size
    return weights, trainable, trainable_bytes


def optimizer_bytes(optim: str, trainable: int, trainable_bytes: int, step_list: int | None = None):
    """(state bytes, step temporaries, a note when the optimizer is not one the plan models). The step's
    temporaries: none for a fused kernel (adamw_torch_fused, lathe.llm's default); otherwise torch's
    foreach step (its default for CUDA tensors) makes one parameter-sized list (AdamW's sqrt(v)), and on
    the CPU it steps one parameter at a time: `step_list` gives that size (None: the whole list)."""
    name = str(getattr(optim, "value", optim))
    step = 0 if "fused" in name else trainable_bytes if step_list is None else step_list
    if any(part in name for part in STATELESS_OPTIMIZERS):
        return 0, step, None
    if any(part in name for part in EIGHT_BIT_OPTIMIZERS):
        return 2 * trainable, step, None
    note = None if name.startswith("adamw") or name == "adam" else f"optimizer {name}: state assumed Adam-sized"
    return 2 * trainable_bytes, step, note


def _largest_trainable(model) -> int:
    return max((p.numel() * p.element_size() for p in model.parameters() if p.requires_grad), default=0)


@dataclass
class Settings:
    """The run's settings the plan depends on (from the train config, or given by hand)."""

    batch: int
    seq_len: int
    optim: str = "adamw_torch"
    checkpointing: bool = False
    accumulation: int = 1
    half: bool = False  # bf16 / fp16 activations
    masked: bool = False  # padded batches: an attention mask is materialised
    chunk: int | None = None  # chunked cross-entropy's tokens per chunk; None: full-vocabulary logits
    quantization_bit: int | None = None
    double_quant: bool = True
    device: str = "cpu"
    stage: str = "sft"  # dpo / kto / rm: lathe.llm.memory.preference's terms
    reference_copy: bool = False  # dpo / kto: a frozen copy of the base model is loaded as the reference
    kl_seq_len: int | None = None  # kto: the longest padded KL row
    reference_forward: bool = True  # dpo: the reference's log-probs are computed (not for orpo / simpo)
    sharding: object | None = None  # lathe.llm.memory.sharding.Sharding; None: one process holds everything


def estimate_memory(model, settings: Settings, available: int | None = None) -> MemoryPlan | None:
    """The plan for `model` as set up for training (method applied, possibly on the meta device);
    None when the model is not a transformers decoder the plan knows how to size."""
    shape = model_shape(model)
    if shape is None:
        return None
    weights, trainable, trainable_bytes = parameter_bytes(model, settings.quantization_bit, settings.double_quant)
    unused, unused_bytes = unused_head_bytes(model, settings.stage)  # rm: the LM head gets no gradient
    trainable, trainable_bytes = trainable - unused, trainable_bytes - unused_bytes
    # torch steps foreach (one list for all parameters) on CUDA, one parameter at a time elsewhere, where
    # sqrt(v) and its quotient by the bias correction coexist: twice the largest parameter.
    one_at_a_time = None if settings.device.startswith("cuda") else 2 * _largest_trainable(model)
    optimizer, step_temp, note = optimizer_bytes(settings.optim, trainable, trainable_bytes, one_at_a_time)
    plan = MemoryPlan(
        weights=weights,
        gradients=trainable_bytes,
        optimizer=optimizer,
        activations=0,
        activations_other=0,
        logits=0,
        optimizer_step=step_temp,
        peak=0,
        batch_size=settings.batch,
        seq_len=settings.seq_len,
        checkpointing=settings.checkpointing,
        loss_path=loss_path(settings, model),
        device=settings.device,
        available=available,
        notes=[note] if note else [],
        stage=settings.stage,
    )
    if settings.reference_copy:
        plan.reference = reference_bytes(
            model, 2 if settings.half else 4, settings.quantization_bit, settings.double_quant
        )
    shard_plan(plan, model, settings.sharding, settings.half)
    if not any(name.endswith(PROJECTIONS) for name, _ in model.named_modules()):
        plan.notes.append(f"{type(model).__name__}: activations sized as a Llama-style decoder's")
    fill_batch_terms(plan, model, shape, settings)
    plan.largest_batch = largest_fitting_batch(plan, model, shape, settings)
    return plan


def loss_path(settings: Settings, model=None) -> str:
    """The plan's words for the loss path it assumed."""
    if settings.stage == "rm":
        return rm_loss_path(model)
    what = "log-probs" if settings.stage in PREFERENCE_STAGES else "loss"
    if settings.chunk is None:
        return f"standard {what}: full-vocabulary logits"
    return f"chunked {what}: {settings.chunk} tokens per chunk"


def fill_batch_terms(plan: MemoryPlan, model, shape: Shape, settings: Settings) -> None:
    element = 2 if settings.half else 4
    batch, seq_len = rows_per_forward(settings.stage, settings.batch), settings.seq_len
    args = (model, shape, batch, seq_len, element)
    kept, recompute = activation_bytes(*args, settings.checkpointing, settings.masked)
    other, other_recompute = activation_bytes(*args, not settings.checkpointing, settings.masked)
    if settings.stage == "rm":
        head = value_head_activations(shape, batch, seq_len)
        kept, other = kept + head, other + head
    copies = autocast_weight_copies(model) if settings.half else 0  # kept without checkpointing only
    kept, other = (kept, other + copies) if settings.checkpointing else (kept + copies, other)
    plan.activations, plan.activations_other = kept + recompute, other + other_recompute
    if settings.stage == "rm":
        plan.logits = lm_logits_bytes(model, shape, batch, seq_len, element)
    elif settings.stage in PREFERENCE_STAGES:
        plan.logits = log_prob_bytes(shape, batch, seq_len, settings.half, settings.chunk, lm_head_trains(model))
    else:
        plan.logits = logits_bytes(shape, batch, seq_len, settings.half, settings.chunk, lm_head_trains(model))
    # A layer's transient tensors during backward (the gradient flowing down, an MLP-wide one).
    workspace = batch * seq_len * (2 * shape.hidden + shape.intermediate) * element
    if settings.stage in PREFERENCE_STAGES:
        plan.peak = preference_peak(plan, model, shape, settings, kept, recompute, workspace)
        return
    held_gradients = plan.gradients if settings.accumulation > 1 else 0
    # The loss's backward comes first, before any layer is recomputed; then layer by layer, while the
    # gradients fill in; then the optimizer's step.
    loss_backward = kept + plan.logits + held_gradients + plan.gathered
    layers_backward = kept + recompute + workspace + plan.gradients + plan.gathered
    optimizer_step = plan.gradients + plan.optimizer_step
    base = plan.weights + plan.optimizer + plan.buckets
    plan.peak = base + max(loss_backward, layers_backward, optimizer_step)


def largest_fitting_batch(plan: MemoryPlan, model, shape: Shape, settings: Settings, limit: int = BATCH_LIMIT):
    """The largest per-device batch whose planned peak fits the available memory (0: not even 1; None:
    the available memory is unknown)."""
    if plan.available is None:
        return None
    import dataclasses

    def fits(batch: int) -> bool:
        trial = dataclasses.replace(plan, notes=[])
        fill_batch_terms(trial, model, shape, dataclasses.replace(settings, batch=batch))
        return trial.peak <= plan.available

    low, high = 0, 1
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:  # fits(low) and not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
