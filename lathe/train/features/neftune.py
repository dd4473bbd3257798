"""NEFTune (neftune_noise_alpha): uniform noise added to the input embeddings while the model trains,
scaled by alpha / sqrt(sequence length x hidden size), as transformers does; the hook is removed when
train() ends."""

from __future__ import annotations

import torch


def _noise_hook(module, inputs, output):
    if module.training:
        dims = torch.tensor(output.size(1) * output.size(2))
        magnitude = module.neftune_noise_alpha / torch.sqrt(dims)
        output = output + torch.zeros_like(output).uniform_(-magnitude, magnitude)
    return output


def _input_embeddings(model):
    base = getattr(model, "module", model)  # under DDP
    if hasattr(base, "get_base_model") and hasattr(base, "peft_config"):  # a PEFT model: its base's embeddings
        base = base.get_base_model()
    getter = getattr(base, "get_input_embeddings", None)
    embeddings = getter() if callable(getter) else None
    if not isinstance(embeddings, torch.nn.Module):
        raise ValueError(
            f"neftune_noise_alpha adds noise to the input embeddings, but {type(base).__name__} has no "
            "get_input_embeddings() returning a module; leave neftune_noise_alpha unset for this model."
        )
    return embeddings


def activate(model, alpha: float):
    """Register the noise hook on the model's input embeddings; returns the handle `deactivate` takes."""
    embeddings = _input_embeddings(model)
    embeddings.neftune_noise_alpha = alpha
    return embeddings, embeddings.register_forward_hook(_noise_hook)


def deactivate(handle) -> None:
    embeddings, hook = handle
    hook.remove()
    if hasattr(embeddings, "neftune_noise_alpha"):
        del embeddings.neftune_noise_alpha
