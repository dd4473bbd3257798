"""The MoE router loss of `moe_aux_loss_coef`: which config attributes a trainable model's loader sets, family by
family, as LLaMA-Factory 0.9.5's loader sets them.

transformers' MoE causal LMs add `router_aux_loss_coef x` the load-balancing loss to their loss only when their
config's `output_router_logits` is on (read when the model is built, so this runs on the config before). The tables
are LLaMA-Factory's, quirks included: DBRX and GLM-4.5V's text model get the router logits but keep their own
coefficient; DeepSeek's (remote code) and JetMoE's coefficients have other names; the MoE families it does not
name (Qwen3-Omni, Qwen3-VL-MoE, DeepSeek-V3, GLM-4.5, gpt-oss, ...) are left as they are, so the key changes
nothing there (tests/llm/test_moe.py compares every family with tests/llm/golden/llamafactory_moe.json).
"""

from __future__ import annotations

# model_type -> the attributes set on the config itself ("coef" stands for moe_aux_loss_coef)
MODEL_TYPES: dict[str, dict[str, object]] = {
    "dbrx": {"output_router_logits": True},
    "deepseek": {"aux_loss_alpha": "coef"},
    "jetmoe": {"output_router_logits": True, "aux_loss_coef": "coef"},
    **{
        model_type: {"output_router_logits": True, "router_aux_loss_coef": "coef"}
        for model_type in (
            "ernie4_5_moe",
            "granitemoe",
            "jamba",
            "llama4",
            "mixtral",
            "olmoe",
            "phimoe",
            "qwen2_moe",
            "qwen3_moe",
        )
    },
}
# a multimodal model's text_config model_type -> the attributes set on its text_config
TEXT_MODEL_TYPES: dict[str, dict[str, object]] = {
    "glm4v_moe_text": {"output_router_logits": True},  # GLM-4.5V
    "qwen3_moe": {"output_router_logits": True, "router_aux_loss_coef": "coef"},  # InternVL 3.5's MoE
}


def configure_moe(config, moe_aux_loss_coef: float | None, is_trainable: bool) -> None:
    """Turn on the router loss with `moe_aux_loss_coef` on `config` (and its text_config) for training; unset or 0,
    or not training, changes nothing."""
    if not is_trainable or not moe_aux_loss_coef:
        return
    targets = [(config, MODEL_TYPES.get(getattr(config, "model_type", None), {}))]
    text_config = getattr(config, "text_config", None)
    if text_config is not None:
        targets.append((text_config, TEXT_MODEL_TYPES.get(getattr(text_config, "model_type", None), {})))
    for target, attributes in targets:
        for name, value in attributes.items():
            setattr(target, name, moe_aux_loss_coef if value == "coef" else value)
