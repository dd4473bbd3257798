"""GaLore (gradient low-rank projection, Zhao et al. 2024) from the galore-torch package (lazy import)."""

from __future__ import annotations

INSTALL_HINT = "pip install 'lathe[galore]'  (or: pip install galore-torch)"

# The kind of AdamW-like update GaLore wraps -> the galore_torch class that does it with projected gradients.
_CLASSES = {"adamw": "GaLoreAdamW", "adamw_8bit": "GaLoreAdamW8bit", "adafactor": "GaLoreAdafactor"}


def optimizer_class(kind: str, who: str):
    """The galore_torch optimizer class for `kind` (adamw, adamw_8bit, adafactor); `who` names the setting
    that asked for it, for the install hint."""
    try:
        import galore_torch
    except ImportError as error:
        raise ImportError(f"{who} needs the galore-torch package: {INSTALL_HINT}") from error
    return getattr(galore_torch, _CLASSES[kind])


def group_options(rank: int, update_proj_gap: int, scale: float, proj_type: str) -> dict:
    """The param-group keys galore_torch reads to project a group's gradients."""
    return {"rank": rank, "update_proj_gap": update_proj_gap, "scale": scale, "proj_type": proj_type}


def state_classes() -> list[type]:
    """The objects galore_torch keeps in optimizer state (one projector per matrix), for safe loading."""
    from galore_torch.galore_projector import GaLoreProjector

    return [GaLoreProjector]
