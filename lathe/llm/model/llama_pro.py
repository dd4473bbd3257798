"""LLaMA Pro (block expansion): `lathe expand` writes a model with an identity-initialised copy after
every k-th block, and use_llama_pro trains only those copies (freeze) or adapts only them (lora).

A copy starts as its source block with the output projections of attention (o_proj) and MLP
(down_proj) zeroed: the block adds exactly zero to the residual stream, so the expanded model computes
what the original did, bit for bit, until training moves the copies. LLaMA-Factory's
scripts/llama_pro.py makes the same layout (copy i*k+k-1 follows block i*k+k-1 of the original).
"""

from __future__ import annotations

import copy
import logging
import os

__all__ = ["expand_blocks", "expanded_layer_ids", "find_expanded_modules", "ZEROED_PROJECTIONS"]

logger = logging.getLogger(__name__)

# The projections that write a block's output into the residual stream (Llama, Mistral, Qwen2, Yi, ...).
ZEROED_PROJECTIONS = ("o_proj", "down_proj")


def expanded_layer_ids(num_layers: int, num_expanded: int) -> range:
    """Indices of the expanded blocks in a model of num_layers (original + num_expanded): the last of
    every group of num_layers / num_expanded."""
    if num_expanded <= 0 or num_layers % num_expanded != 0:
        raise ValueError(
            f"use_llama_pro: the model's {num_layers} layers must be divisible by freeze_trainable_layers "
            f"(the number of expanded blocks), got {num_expanded}."
        )
    stride = num_layers // num_expanded
    return range(stride - 1, num_layers + stride - 1, stride)


def find_expanded_modules(model, targets: list[str], num_expanded: int) -> list[str]:
    """Full names of the target modules inside the expanded blocks (LLaMA-Factory's rule: a name
    matches when it contains a target and the block's '.index.')."""
    from lathe.llm.model.layers import find_layer_stack

    _, num_layers = find_layer_stack(model)
    blocks = [f".{index}." for index in expanded_layer_ids(num_layers, num_expanded)]
    names = [
        name
        for name, _ in model.named_modules()
        if any(target in name for target in targets) and any(block in name for block in blocks)
    ]
    logger.info("use_llama_pro: adapting layers %s", list(expanded_layer_ids(num_layers, num_expanded)))
    return names


def expand_blocks(
    model_name_or_path: str,
    output_dir: str,
    num_expand: int,
    max_shard_size: str = "5GB",
    trust_remote_code: bool = False,
) -> dict:
    """Write the expanded model (weights, config, tokenizer) to output_dir and check that it computes what
    the original does; returns {"layers": (before, after), "copied_from": [...], "max_difference": float}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lathe.llm.model.layers import find_layer_stack

    if os.path.isdir(output_dir) and os.listdir(output_dir):
        raise ValueError(f"output_dir {output_dir!r} is not empty: choose a new folder (nothing is overwritten).")
    source = AutoModelForCausalLM.from_pretrained(
        model_name_or_path, dtype="auto", local_files_only=True, trust_remote_code=trust_remote_code
    )
    stack, num_layers = find_layer_stack(source)
    if num_expand <= 0 or num_layers % num_expand != 0:
        raise ValueError(f"num_expand: the model's {num_layers} layers must be divisible by it, got {num_expand}.")
    config, order = _expanded_config(source.config, num_layers, num_expand)
    state = _expanded_state(source.state_dict(), stack, order)
    expanded = AutoModelForCausalLM.from_config(
        config, dtype=next(source.parameters()).dtype, trust_remote_code=trust_remote_code
    )
    expanded.load_state_dict(state, strict=True)
    expanded.generation_config = copy.deepcopy(source.generation_config)

    probe = torch.arange(min(16, config.vocab_size)).unsqueeze(0)
    with torch.no_grad():
        difference = float((expanded(input_ids=probe).logits - source(input_ids=probe).logits).abs().max())
    if difference != 0.0:
        raise RuntimeError(
            f"The expanded model does not compute what {model_name_or_path} does (logits differ by "
            f"{difference:.2e}): its blocks do not write through {'/'.join(ZEROED_PROJECTIONS)}. Nothing was written."
        )
    expanded.save_pretrained(output_dir, max_shard_size=max_shard_size)
    AutoTokenizer.from_pretrained(
        model_name_or_path, local_files_only=True, trust_remote_code=trust_remote_code
    ).save_pretrained(output_dir)
    return {
        "layers": (num_layers, num_layers + num_expand),
        "copied_from": [source_index for source_index, _ in order],
        "max_difference": difference,
    }


def _expanded_config(config, num_layers: int, num_expand: int):
    """The config with num_expand more layers, and the new order: (source layer, is_copy) per layer.
    Per-layer lists (layer_types of Qwen2, Gemma, ...) gain the copied block's entry."""
    split = num_layers // num_expand
    order = []
    for index in range(num_layers):
        order.append((index, False))
        if (index + 1) % split == 0:
            order.append((index, True))
    config = copy.deepcopy(config)
    text_config = getattr(config, "text_config", None) or config
    for name, value in vars(text_config).items():
        if isinstance(value, list) and len(value) == num_layers and name != "architectures":
            setattr(text_config, name, [value[source] for source, _ in order])
    text_config.num_hidden_layers = num_layers + num_expand
    return config, order


def _expanded_state(state: dict, stack: str, order: list[tuple[int, bool]]) -> dict:
    result = {key: value for key, value in state.items() if not key.startswith(stack + ".")}
    for new_index, (source, is_copy) in enumerate(order):
        prefix = f"{stack}.{source}."
        block = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
        if is_copy and not any(part in ZEROED_PROJECTIONS for name in block for part in name.split(".")):
            raise ValueError(
                f"expand: block {source} has no {'/'.join(ZEROED_PROJECTIONS)} projection to zero, "
                "so a copy could not start as the identity."
            )
        for name, value in block.items():
            zero = is_copy and any(part in ZEROED_PROJECTIONS for part in name.split("."))
            result[f"{stack}.{new_index}.{name}"] = value.new_zeros(value.shape) if zero else value.clone()
    return result
