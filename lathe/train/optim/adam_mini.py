"""Adam-mini (Zhang et al. 2024: one second-moment value per block of parameters) from the adam-mini package."""

from __future__ import annotations

INSTALL_HINT = "pip install 'lathe[adam-mini]'  (or: pip install adam-mini)"


def create_adam_mini(
    model, lr: float, betas: tuple[float, float], eps: float, weight_decay: float, model_sharding: bool
):
    """Adam_mini over `model`'s named parameters; the attention shapes come from model.config (hidden_size,
    num_attention_heads, num_key_value_heads), which Adam-mini needs to cut q/k/v into heads."""
    try:
        from adam_mini import Adam_mini
    except ImportError as error:
        raise ImportError(f"use_adam_mini needs the adam-mini package: {INSTALL_HINT}") from error
    config = getattr(model, "config", None)
    return Adam_mini(
        named_parameters=model.named_parameters(),
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        model_sharding=model_sharding,
        dim=getattr(config, "hidden_size", None),
        n_heads=getattr(config, "num_attention_heads", None),
        n_kv_heads=getattr(config, "num_key_value_heads", None),
    )
