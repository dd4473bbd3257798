"""Which stage reads which options: the cross-section checks of a stage's options (an option that no
code of the chosen stage reads is an error, not ignored), and LLaMA-Factory's per-stage model-load
setting `enable_liger_kernel`."""

from __future__ import annotations

__all__ = ["check_stage_options", "resolve_liger_kernel"]

# LLaMA-Factory's stages that read whole logits (rewards, preference log-probs): Liger's fused linear
# cross-entropy, which never builds them, is switched off there, as LLaMA-Factory does (require_logits).
_LOGITS_STAGES = ("rm", "dpo", "kto")


def resolve_liger_kernel(stage: str, training) -> None:
    """enable_liger_kernel (LLaMA-Factory: Liger's kernels patched in when the model loads) is transformers'
    use_liger_kernel in lathe: Liger on a CUDA GPU with liger-kernel installed, else lathe's chunked
    cross-entropy, which the Trainer logs. Stages that read logits keep Liger's plain cross-entropy."""
    training.use_liger_kernel = True
    if stage in _LOGITS_STAGES and training.liger_kernel_config is None:
        training.liger_kernel_config = {"fused_linear_cross_entropy": False, "cross_entropy": True}


def check_stage_options(data, training, finetuning, where: str) -> None:
    """Options that only some stages read: set for another stage, they are errors (nothing would read them)."""
    if finetuning.stage != "sft":
        if training.predict_with_generate:
            raise ValueError(f"predict_with_generate{where} only applies to stage sft.")
        if data.neat_packing:
            raise ValueError(f"neat_packing{where} only applies to stage sft (pt always concatenates documents).")
        if data.train_on_prompt or data.mask_history:
            raise ValueError(f"train_on_prompt and mask_history{where} only apply to stage sft.")
    if finetuning.stage == "sft" and training.do_predict and not training.predict_with_generate:
        raise ValueError(f"do_predict{where} writes generated_predictions.jsonl and needs predict_with_generate: true.")
    if finetuning.stage in ("rm", "dpo", "kto", "grpo", "rloo") and data.packing:
        raise ValueError(
            f"packing{where} applies to stages pt and sft; stage {finetuning.stage} keeps one example per row."
        )
    if finetuning.stage in ("dpo", "kto") and training.do_predict:
        raise ValueError(
            f"do_predict{where} is not read by stage {finetuning.stage}: predictions are written for stage sft (generated answers) and rm (scores)."
        )
    if finetuning.stage == "rm" and training.load_best_model_at_end:
        raise ValueError(f"load_best_model_at_end{where} is not supported for stage rm (as in LLaMA-Factory).")
