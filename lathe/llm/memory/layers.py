"""What each decoder layer of a model trains, for the memory plan's activation term: which projections
keep their input for backward, LoRA ranks and dropouts, whether the norms, embeddings and head train."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def has_lora(model) -> bool:
    """Whether the model carries LoRA adapters (peft's lora_A / lora_B parameters)."""
    return any(".lora_" in name for name, _ in model.named_parameters())


def layer_index(name: str) -> int | None:
    match = re.search(r"\.layers\.(\d+)\.", name)
    return int(match.group(1)) if match else None


@dataclass
class LayerMethod:
    """What one decoder layer trains: which projections keep their input for backward, LoRA ranks."""

    trained: bool = False
    norms_trained: bool = False
    saves_input: set = field(default_factory=set)
    lora_rank: dict = field(default_factory=dict)
    dropout_inputs: int = 0  # elements per token of the LoRA dropouts' outputs (each keeps its own copy)


def layer_methods(model, layers: int) -> tuple[list[LayerMethod], bool, bool]:
    """Per layer what trains; whether the embeddings and the LM head train (or carry LoRA)."""
    methods = [LayerMethod() for _ in range(layers)]
    embeddings = head = False
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        index = layer_index(name)
        if index is None or index >= layers:
            embeddings |= "embed" in name
            head |= "lm_head" in name
            continue
        layer = methods[index]
        layer.trained = True
        projection = next((part for part in PROJECTIONS if f".{part}." in name), None)
        if projection is None:
            layer.norms_trained |= "norm" in name
        else:
            layer.saves_input.add(projection)
            if ".lora_A." in name:
                layer.lora_rank[projection] = param.shape[0]
    for name, module in model.named_modules():
        index = layer_index(name + ".")
        if ".lora_dropout." in name and index is not None and index < layers and getattr(module, "p", 0) > 0:
            in_features = getattr(module, "in_features", None) or _lora_in_features(model, name)
            methods[index].dropout_inputs += in_features
    return methods, embeddings, head


def lm_head_trains(model) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head is not None and any(param.requires_grad for param in head.parameters())


def _lora_in_features(model, dropout_name: str) -> int:
    owner = model.get_submodule(dropout_name.split(".lora_dropout.")[0])
    base = getattr(owner, "base_layer", owner)
    return int(getattr(base, "in_features", 0))
