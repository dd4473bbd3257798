"""APOLLO (approximated gradient scaling, Zhu et al. 2024) from the apollo-torch package (lazy import)."""

from __future__ import annotations

INSTALL_HINT = "pip install 'lathe[apollo]'  (or: pip install apollo-torch)"


def optimizer_class(who: str):
    """apollo_torch's APOLLOAdamW; `who` names the setting that asked for it, for the install hint."""
    try:
        from apollo_torch import APOLLOAdamW
    except ImportError as error:
        raise ImportError(f"{who} needs the apollo-torch package: {INSTALL_HINT}") from error
    return APOLLOAdamW


def group_options(
    rank: int,
    proj: str,
    proj_type: str,
    update_proj_gap: int,
    scale: float,
    scale_type: str,
    scale_front: bool | None = None,
) -> dict:
    """The param-group keys apollo_torch reads (scale_front only where the caller sets it)."""
    options = {
        "rank": rank,
        "proj": proj,
        "proj_type": proj_type,
        "update_proj_gap": update_proj_gap,
        "scale": scale,
        "scale_type": scale_type,
    }
    if scale_front is not None:
        options["scale_front"] = scale_front
    return options


def state_classes() -> list[type]:
    """The objects apollo_torch keeps in optimizer state (random or SVD projectors), for safe loading."""
    from apollo_torch.random_projector import GradientProjector
    from apollo_torch.svd_projector import GaLoreProjector

    return [GradientProjector, GaLoreProjector]
