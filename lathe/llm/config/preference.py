"""The preference keys of FinetuningArguments: which stage reads which key, checked once when the
config is parsed, so a key that would change nothing in the chosen stage is an error, not ignored."""

from __future__ import annotations

# key -> (LLaMA-Factory's default, the stages (and dpo losses) that read it)
PREFERENCE_KEYS = {
    "pref_beta": (0.1, "dpo and kto"),
    "pref_ftx": (0.0, "dpo and kto"),
    "pref_bco_weight": (0.0, "dpo with pref_loss sigmoid, hinge or ipo"),
    "pref_loss": ("sigmoid", "dpo"),
    "dpo_label_smoothing": (0.0, "dpo with pref_loss sigmoid"),
    "kto_chosen_weight": (1.0, "kto"),
    "kto_rejected_weight": (1.0, "kto"),
    "simpo_gamma": (0.5, "dpo with pref_loss simpo"),
    "ref_model": (None, "dpo (sigmoid, hinge, ipo) and kto"),
    "ref_model_adapters": (None, "dpo (sigmoid, hinge, ipo) and kto"),
    "ld_alpha": (None, "dpo"),
}
REFERENCE_FREE_LOSSES = ("orpo", "simpo")


def _reads(key: str, args) -> bool:
    """Whether this run reads `key` (FinetuningArguments after the basic fields are set)."""
    stage, loss = args.stage, args.pref_loss
    if key in ("pref_beta", "pref_ftx"):
        return stage in ("dpo", "kto")
    if key in ("pref_loss", "ld_alpha"):
        return stage == "dpo"
    if key == "pref_bco_weight":
        return stage == "dpo" and loss not in REFERENCE_FREE_LOSSES
    if key == "dpo_label_smoothing":
        return stage == "dpo" and loss == "sigmoid"
    if key in ("kto_chosen_weight", "kto_rejected_weight"):
        return stage == "kto"
    if key == "simpo_gamma":
        return stage == "dpo" and loss == "simpo"
    return stage == "kto" or (stage == "dpo" and loss not in REFERENCE_FREE_LOSSES)  # ref_model*


def check_preference_arguments(args) -> None:
    """Errors for values the stage cannot use, and for values out of range."""
    for key, (default, readers) in PREFERENCE_KEYS.items():
        value = getattr(args, key)
        if value != default and value not in (None, []) and not _reads(key, args):
            what = f"stage {args.stage}" + (f" with pref_loss {args.pref_loss}" if args.stage == "dpo" else "")
            raise ValueError(
                f"{key}: {value!r} is read by {readers} only, not by {what}: remove it or change the stage/loss."
            )
    if args.stage == "dpo" and args.pref_loss == "kto_pair":
        raise ValueError(
            "pref_loss: kto_pair is not supported: LLaMA-Factory 0.9.5 accepts it but trains the sigmoid loss instead "
            "(TRL 0.24 has no kto_pair). Use stage: kto for KTO, or pref_loss: sigmoid."
        )
    if args.pref_beta <= 0:
        raise ValueError(f"pref_beta must be positive, got {args.pref_beta}.")
    if not 0 <= args.dpo_label_smoothing < 0.5:
        raise ValueError(f"dpo_label_smoothing must be in [0, 0.5), got {args.dpo_label_smoothing}.")
    for key in ("pref_ftx", "pref_bco_weight", "kto_chosen_weight", "kto_rejected_weight"):
        if getattr(args, key) < 0:
            raise ValueError(f"{key} must be >= 0, got {getattr(args, key)}.")
    if args.ref_model_adapters and not args.ref_model:
        raise ValueError("ref_model_adapters needs ref_model: the folder of the model the adapters belong to.")
