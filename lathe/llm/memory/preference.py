"""The memory plan's terms for the preference stages (dpo, kto, rm): how many rows one forward pass
carries, the reference model's weights, the no-grad forward passes that run while the policy's
activations are kept (the reference's log-probs, kto's KL rows), the policy's log-prob path, and the
reward model's value head. lathe/llm/memory/plan.py combines them into the peak; docs/MEMORY.md gives
each term and its measured accuracy.

What each stage holds at its peak (read from lathe/llm/preference/ and lathe/llm/data/):
- dpo: chosen and rejected rows concatenated, one forward of 2 x batch rows (PairwiseDataCollator);
  the policy forward first (activations kept), then the reference forward without gradients.
- kto: batch target rows with gradients; the KL rows (each prompt with another row's answer, padded on
  their own) through the policy and the reference, and the target rows through the reference, all
  without gradients.
- rm: 2 x batch rows through the causal LM with output_hidden_states; the LM computes its logits for the
  last position only (`logits_to_keep=1`; a model whose forward lacks it builds them all), unused, so
  the LM head gets no gradient and no optimizer state; a value head (dropout, one linear) scores the
  last hidden state.
"""

from __future__ import annotations

from lathe.llm.memory.layers import layer_index
from lathe.llm.memory.sizes import logits_bytes, packed_bytes, quantized_bytes

PREFERENCE_STAGES = ("dpo", "kto", "rm")
PAIRED_STAGES = ("dpo", "rm")  # chosen and rejected in one batch of 2 x batch rows


def rows_per_forward(stage: str, batch: int) -> int:
    """Sequences in one forward pass of a per-device batch of `batch` examples."""
    return 2 * batch if stage in PAIRED_STAGES else batch


def reference_bytes(model, element: int, quantization_bit: int | None, double_quant: bool) -> int:
    """A frozen copy of the base model (reference.create_reference_model): every parameter but the
    adapters' and the value head's, in the compute dtype (`element` bytes), its decoder linears
    quantized as the policy's base is when quantization_bit is set."""
    import torch

    total = 0
    seen = set()
    for name, module in model.named_modules():
        if "lora_" in name or "v_head" in name.split("."):
            continue
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen or "lora_" in param_name:
                continue
            seen.add(id(param))
            if param.dtype in (torch.uint8, torch.int8):  # already quantized by bitsandbytes
                total += packed_bytes(param)
            elif quantization_bit and isinstance(module, torch.nn.Linear) and layer_index(name + ".") is not None:
                total += quantized_bytes(module, quantization_bit, double_quant)
            else:
                total += param.numel() * element
    return total


def unused_head_bytes(model, stage: str) -> tuple[int, int]:
    """(elements, bytes) of trainable parameters that never get a gradient: the rm's LM head (its logits feed no loss; AdamW keeps
    no state for a parameter without a gradient). A head tied to the embeddings gets theirs."""
    if stage != "rm":
        return 0, 0
    inner = getattr(model, "pretrained_model", model)
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    embeddings = inner.get_input_embeddings() if hasattr(inner, "get_input_embeddings") else None
    if head is None or (embeddings is not None and head.weight is embeddings.weight):
        return 0, 0
    trained = [param for param in head.parameters() if param.requires_grad]
    return sum(param.numel() for param in trained), sum(param.numel() * param.element_size() for param in trained)


def no_grad_forward_bytes(shape, rows: int, seq_len: int, element: int, masked: bool, chunk: int | None) -> int:
    """The transient peak of a forward pass without gradients (reference log-probs, KL rows), on top of
    what the policy keeps: one layer's tensors at a time, `5H + 3I + 2 head_dim` values per token (the
    residual stream, the embeddings' output, the normalised input and its temporaries; the MLP's gate
    activation, up and their product; the rotary tables: fitted to the peaks measured on four Llama shapes,
    hidden 64-256 and MLP 160-1,024, which it gives at 0.94-0.98), the boolean attention mask of padded rows (one byte per
    element), and the log-prob path: one chunk's fp32 logits and logsumexp's temporary, or (standard path)
    the policy's logits and log-probabilities, which the loss holds, beside this pass's logits, their
    shifted copy and its log-probabilities."""
    tokens = rows * seq_len
    layer = tokens * (5 * shape.hidden + 3 * shape.intermediate + 2 * shape.head_dim) * element
    mask = rows * seq_len * seq_len if masked else 0
    logits = 2 * min(chunk, tokens) * shape.vocab * 4 if chunk is not None else 5 * tokens * shape.vocab * 4
    return max(layer, logits) + mask


def log_prob_bytes(shape, rows: int, seq_len: int, half: bool, chunk: int | None, head_trains: bool) -> int:
    """The policy's log-prob path at its peak, in its backward. Chunked (preference.logprobs through
    chunked_loss.chunked_token_log_probs: each chunk checkpointed, its logits recomputed in backward): the
    recomputed fp32 logits kept by logsumexp, logsumexp's gradient and its temporary, and the gather's
    gradient (4 x chunk x vocab x 4 bytes, measured 3.4-4); the labelled hidden states, their gradient
    and its scattered copy; a trained head's weight gradient and a chunk's contribution to it. Standard
    (losses.sequence_log_probs on the model's logits): the standard loss's term, sizes.logits_bytes
    (the saved log-probabilities, their gradient and the logits' gradient; measured 2.98)."""
    if chunk is None:
        return logits_bytes(shape, rows, seq_len, half, None, head_trains)
    element = 2 if half else 4
    head = 2 * shape.vocab * shape.hidden * 4 if head_trains else 0
    return 4 * min(chunk, rows * seq_len) * shape.vocab * 4 + 3 * rows * seq_len * shape.hidden * element + head


def value_head_activations(shape, rows: int, seq_len: int) -> int:
    """rm: what the value head keeps for backward: its dropout's fp32 output (the linear's input) and the
    dropout's one-byte mask."""
    return rows * seq_len * shape.hidden * (4 + 1)


def lm_logits_bytes(model, shape, rows: int, seq_len: int, element: int) -> int:
    """rm: the logits the causal LM builds at the end of its forward (model dtype), unused."""
    return rows * rm_logit_positions(model, seq_len) * shape.vocab * element


def rm_logit_positions(model, seq_len: int) -> int:
    """How many positions' logits the reward model's LM computes: one where it takes logits_to_keep."""
    return 1 if getattr(model, "_keeps_logits_of_last_position_only", False) else seq_len


def rm_loss_path(model) -> str:
    if rm_logit_positions(model, 2) == 1:
        return "value head: the LM's logits for the last position only"
    return "value head: the LM's full-vocabulary logits built in the forward, unused"


def preference_peak(plan, model, shape, settings, kept: int, recompute: int, workspace: int) -> int:
    """The peak of a preference step: weights (policy and reference) and optimizer state, plus the
    largest of: the end of the forward (dpo/kto: the no-grad forwards run while the policy's activations
    are kept; rm: the LM's logits), the policy's loss backward, its layers' backward and the optimizer step."""
    rows = rows_per_forward(settings.stage, settings.batch)
    element = 2 if settings.half else 4
    held_gradients = plan.gradients if settings.accumulation > 1 else 0
    kept += plan.gathered  # FSDP2 / ZeRO-3: parameters held whole while computing
    if settings.stage == "rm":  # the LM's logits exist at the end of the forward only
        forward_end, loss_backward = kept + plan.logits, kept + held_gradients
    else:
        seq_len = max(settings.seq_len, settings.kl_seq_len or 0)
        no_grad = no_grad_forward_bytes(shape, rows, seq_len, element, settings.masked, settings.chunk)
        # kto always runs its KL rows without gradients; dpo runs the reference unless the loss has none.
        forward_end = kept + no_grad if settings.stage == "kto" or settings.reference_forward else 0
        loss_backward = kept + plan.logits + held_gradients
    layers_backward = kept + recompute + workspace + plan.gradients
    optimizer_step = plan.gradients + plan.optimizer_step
    steps = (forward_end, loss_backward, layers_backward, optimizer_step)
    return plan.weights + plan.reference + plan.optimizer + plan.buckets + max(steps)
