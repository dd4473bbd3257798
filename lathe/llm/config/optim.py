"""LLaMA-Factory 0.9.5's keys for memory-efficient optimizers (GaLore, APOLLO, BAdam, Adam-mini, Muon) and
SFT loss variants (DFT, ASFT, EAFT), with its names, defaults and checks; FinetuningArguments inherits them.

LLaMA-Factory picks the first of several optimizer (or loss) keys that are set and silently drops the rest;
here setting two is an error, since one of them would be ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lathe.llm.config.values import split_commas

__all__ = ["OptimizerMethodArguments", "validate_methods", "OPTIMIZER_KEYS", "LOSS_KEYS"]

OPTIMIZER_KEYS = ("use_galore", "use_apollo", "use_badam", "use_adam_mini", "use_muon")
LOSS_KEYS = ("use_dft_loss", "use_asft_loss", "use_eaft_loss")


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class OptimizerMethodArguments:
    """The optimizer and loss keys; `check_optimizer_keys` runs from FinetuningArguments.__post_init__."""

    use_galore: bool = field(
        default=False, metadata=_help("GaLore: project the gradients of linear weights to a low rank.")
    )
    galore_target: str = field(
        default="all", metadata=_help("GaLore: module names (comma separated), or all linear layers.")
    )
    galore_rank: int = field(default=16, metadata=_help("GaLore: rank of the projected gradients."))
    galore_update_interval: int = field(default=200, metadata=_help("GaLore: steps between recomputed projections."))
    galore_scale: float = field(default=2.0, metadata=_help("GaLore: scale of the projected-back update."))
    galore_proj_type: Literal["std", "reverse_std", "right", "left", "full"] = field(
        default="std", metadata=_help("GaLore: which side(s) the gradient is projected on.")
    )
    galore_layerwise: bool = field(
        default=False,
        metadata=_help("GaLore: step each parameter in the backward pass (less memory; no accumulation)."),
    )
    use_apollo: bool = field(
        default=False, metadata=_help("APOLLO: AdamW with low-rank approximated gradient scaling.")
    )
    apollo_target: str = field(
        default="all", metadata=_help("APOLLO: module names (comma separated), or all linear layers.")
    )
    apollo_rank: int = field(default=16, metadata=_help("APOLLO: rank of the auxiliary space."))
    apollo_update_interval: int = field(default=200, metadata=_help("APOLLO: steps between recomputed projections."))
    apollo_scale: float = field(default=32.0, metadata=_help("APOLLO: scaling coefficient."))
    apollo_proj: Literal["svd", "random"] = field(default="random", metadata=_help("APOLLO: svd or random projection."))
    apollo_proj_type: Literal["std", "right", "left"] = field(default="std", metadata=_help("APOLLO: projection side."))
    apollo_scale_type: Literal["channel", "tensor"] = field(
        default="channel", metadata=_help("APOLLO: scale per channel or per tensor.")
    )
    apollo_layerwise: bool = field(default=False, metadata=_help("APOLLO: step each parameter in the backward pass."))
    apollo_scale_front: bool = field(
        default=False, metadata=_help("APOLLO: apply the norm-growth limiter before the gradient scaling.")
    )
    use_badam: bool = field(default=False, metadata=_help("BAdam: block coordinate descent with Adam."))
    badam_mode: Literal["layer", "ratio"] = field(
        default="layer", metadata=_help("BAdam: one block of layers at a time, or a share of each matrix.")
    )
    badam_start_block: int | None = field(default=None, metadata=_help("BAdam layer mode: the block to start with."))
    badam_switch_mode: Literal["ascending", "descending", "random", "fixed"] | None = field(
        default="ascending", metadata=_help("BAdam layer mode: order in which blocks take turns.")
    )
    badam_switch_interval: int | None = field(
        default=50, metadata=_help("BAdam layer mode: steps per block (-1: never switch).")
    )
    badam_update_ratio: float = field(default=0.05, metadata=_help("BAdam ratio mode: share of each matrix updated."))
    badam_mask_mode: Literal["adjacent", "scatter"] = field(
        default="adjacent", metadata=_help("BAdam ratio mode: adjacent or scattered entries.")
    )
    badam_verbose: int = field(
        default=0, metadata=_help("BAdam: 0 quiet, 1 prints the active block, 2 also its parameters.")
    )
    use_adam_mini: bool = field(default=False, metadata=_help("Adam-mini: one second moment per parameter block."))
    use_muon: bool = field(
        default=False, metadata=_help("Muon for 2-D weights (not embeddings or the head), AdamW for the rest.")
    )
    use_dft_loss: bool = field(
        default=False, metadata=_help("DFT: each token's loss weighted by its (detached) probability.")
    )
    use_asft_loss: bool = field(
        default=False, metadata=_help("ASFT: DFT plus asft_alpha x KL to the frozen starting model.")
    )
    asft_alpha: float = field(default=0.1, metadata=_help("ASFT: weight of the KL term."))
    use_eaft_loss: bool = field(
        default=False, metadata=_help("EAFT: each token's loss weighted by (top-20 entropy / 3) ** eaft_alpha.")
    )
    eaft_alpha: float = field(default=1.0, metadata=_help("EAFT: power of the entropy weight."))

    def check_optimizer_keys(self) -> None:
        """Checks within the section (LLaMA-Factory's, plus one error instead of each silent drop)."""
        self.galore_target = split_commas(self.galore_target)
        self.apollo_target = split_commas(self.apollo_target)
        chosen = [key for key in OPTIMIZER_KEYS if getattr(self, key)]
        if getattr(self, "loraplus_lr_ratio", None) is not None:
            chosen.append("loraplus_lr_ratio")
        if len(chosen) > 1:
            raise ValueError(f"{' and '.join(chosen)} each choose the optimizer: set one of them.")
        if self.finetuning_type == "lora" and chosen and chosen[0] in ("use_galore", "use_apollo", "use_badam"):
            raise ValueError(f"{chosen[0]} trains full weights and cannot be combined with finetuning_type: lora.")
        losses = [key for key in LOSS_KEYS if getattr(self, key)]
        if len(losses) > 1:
            raise ValueError(f"{' and '.join(losses)} each replace the loss: set one of them.")
        if self.use_badam and self.badam_mode == "ratio" and self.badam_update_ratio <= 1e-6:
            raise ValueError(
                f"badam_update_ratio must be above 0 for badam_mode: ratio, got {self.badam_update_ratio}."
            )
        for key in ("galore_rank", "apollo_rank", "galore_update_interval", "apollo_update_interval"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be a positive integer, got {getattr(self, key)}.")


def validate_methods(config, where: str) -> None:
    """Checks that need the other sections: stage, accumulation, processes, DeepSpeed."""
    finetuning, training = config.finetuning, config.training
    losses = [key for key in LOSS_KEYS if getattr(finetuning, key)]
    if losses and finetuning.stage != "sft":
        raise ValueError(
            f"{losses[0]}{where} changes the sft loss; stage {finetuning.stage} trains with the plain loss."
        )
    if finetuning.use_asft_loss and finetuning.finetuning_type == "lora":
        raise ValueError(
            f"use_asft_loss{where} needs a reference model, which LLaMA-Factory builds for full and freeze "
            "training only: use finetuning_type full or freeze."
        )
    layerwise = [
        key
        for key in ("galore_layerwise", "apollo_layerwise")
        if getattr(finetuning, key) and getattr(finetuning, "use_" + key.split("_")[0])
    ]
    if layerwise and training.do_train:
        if training.gradient_accumulation_steps != 1:
            raise ValueError(
                f"{layerwise[0]}{where} steps each parameter inside the backward pass: "
                f"set gradient_accumulation_steps: 1 (got {training.gradient_accumulation_steps})."
            )
        if training.world_size > 1:
            raise ValueError(f"{layerwise[0]}{where} does not work with several processes (as in LLaMA-Factory).")
    if (finetuning.use_galore or finetuning.use_apollo) and training.deepspeed:
        raise ValueError(f"use_galore / use_apollo{where} cannot be combined with deepspeed (as in LLaMA-Factory).")
    if finetuning.use_badam and training.world_size > 1:
        raise ValueError(
            f"use_badam{where} runs in one process here: LLaMA-Factory's several-process BAdam needs "
            "DeepSpeed ZeRO-3 hooks that lathe's ZeRO integration does not install."
        )
