"""Where a model's layers are: the hidden-layer stack (find_layer_stack) and the linear layers an adapter can
target (find_all_linear_modules, without the output head). A leaf the fine-tuning methods share: adapters.py
(which dispatches over them), lora.py and llama_pro.py import it, and it imports none of them."""

from __future__ import annotations

# Output heads that are not called lm_head in some families (LLaMA-Factory excludes the same ones).
OUTPUT_HEAD_NAMES = {"lm_head", "output_layer", "output", "embed_out"}


def find_layer_stack(model) -> tuple[str, int]:
    """(qualified name, length) of the model's hidden-layer ModuleList, e.g. ("model.layers", 32)."""
    import torch

    config = getattr(model.config, "text_config", None) or model.config
    num_layers = (
        getattr(config, "num_hidden_layers", None)
        or getattr(config, "num_layers", None)
        or getattr(config, "n_layer", None)
    )
    if not num_layers:
        raise ValueError(f"freeze: {type(model).__name__}'s config does not say how many hidden layers it has.")
    for name, module in model.named_modules():
        # a vision-language model's vision blocks may number the same: they are never the decoder's layers
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers and "visual" not in name:
            return name, num_layers
    raise ValueError(f"freeze: found no list of {num_layers} hidden layers in {type(model).__name__}.")


def find_all_linear_modules(model) -> list[str]:
    """Short names of every linear layer except the output head (lora_target / oft_target: all); quantized
    linear layers (bitsandbytes Linear4bit, ...) count too."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = set()
    for name, module in model.named_modules():
        short = name.split(".")[-1]
        if module is head or short in OUTPUT_HEAD_NAMES:
            continue
        # by class name, as LLaMA-Factory matches: an nn.Linear subclass named otherwise is not a plain linear
        # layer (Llama 4's Llama4Router returns (scores, logits), which a LoRA wrapper cannot add to)
        if "Linear" in type(module).__name__ and "Embedding" not in type(module).__name__:
            names.add(short)
    if not names:
        raise ValueError(f"target all: found no linear layers in {type(model).__name__}.")
    return sorted(names)
