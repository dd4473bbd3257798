"""What llama.cpp expects of each architecture lathe exports to GGUF: the hyperparameters written as
metadata and the tensors renamed (gguf's own name map), permuted and shifted as llama.cpp's converter
(convert_hf_to_gguf.py) does.

- Llama / Mistral (`llama`): q_proj and k_proj rows permuted from Hugging Face's rotate-half order to
  llama.cpp's interleaved RoPE; Llama 3.1's `llama3` RoPE scaling as a `rope_freqs` tensor.
- Qwen2 / 2.5 (`qwen2`, q/k/v biases), Qwen3 (`qwen3`, q/k RMSNorms): written as they are.
- Gemma 2 / Gemma 3 text (`gemma2`, `gemma3`): RMSNorm weights + 1 (Hugging Face stores w for x*(1+w)),
  soft-capping and sliding window; the tied embedding is the output.
- Phi-3 (`phi3`): fused qkv_proj and gate_up_proj kept fused, as llama.cpp reads them.

Anything llama.cpp would compute differently from transformers (a RoPE scaling it does not know, Gemma's
query_pre_attn_scalar other than head_dim, ...) is one clear error naming the config key.
"""

from __future__ import annotations

import math

from lathe.llm.gguf.package import gguf_package

# Hugging Face architecture -> llama.cpp architecture
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
# llama.cpp reads no config key for these: it assumes the value (gemma2 / gemma3 in llama.cpp's src/models).
SWA_PATTERN = {"gemma2": 2, "gemma3": 6}


class UnsupportedModel(ValueError):
    """An architecture, tokenizer or setting llama.cpp cannot run as transformers does."""


def llama_cpp_architecture(config: dict) -> str:
    names = config.get("architectures") or [config.get("model_type", "?")]
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise UnsupportedModel(
        f"export_gguf: architecture {names[0]} is not one lathe writes as GGUF "
        f"(supported: {', '.join(sorted(ARCHITECTURES))})."
    )


def rope_parameters(config: dict, kind: str = "full_attention") -> dict:
    """transformers 5's rope_parameters (per attention kind for Gemma 3), or the 4.x rope_theta + rope_scaling."""
    rope = config.get("rope_parameters")
    if rope is None:
        rope = dict(config.get("rope_scaling") or {})
        if "rope_theta" in config:
            rope["rope_theta"] = config["rope_theta"]
        if kind == "sliding_attention" and "rope_local_base_freq" in config:
            rope = {"rope_theta": config["rope_local_base_freq"]}
    elif kind in rope or "full_attention" in rope:
        rope = rope.get(kind) or {}
    return rope


def head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def write_hyperparameters(writer, config: dict, arch: str, vocab_size: int) -> None:
    gguf = gguf_package()
    heads = config["num_attention_heads"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(vocab_size)
    rope = rope_parameters(config)
    if rope.get("rope_theta") is not None:
        writer.add_rope_freq_base(float(rope["rope_theta"]))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif rope_type not in ("default", "llama3") or (rope_type == "llama3" and arch != "llama"):
        raise UnsupportedModel(
            f"export_gguf: rope_type {rope_type!r} ({arch}) is not written as GGUF by lathe: llama.cpp would "
            "compute positions differently from transformers."
        )
    if arch in ("gemma2", "gemma3"):
        _gemma_hyperparameters(writer, config, arch)
    elif arch == "phi3":
        if config.get("partial_rotary_factor", 1.0) != 1.0:
            raise UnsupportedModel("export_gguf: phi3 with partial_rotary_factor != 1 is not supported.")
        writer.add_rope_dimension_count(head_dim(config))
        writer.add_rope_scaling_orig_ctx_len(
            config.get("original_max_position_embeddings") or config["max_position_embeddings"]
        )
        writer.add_sliding_window(config.get("sliding_window") or 0)
    else:
        writer.add_rope_dimension_count(head_dim(config))
        if config.get("head_dim"):
            writer.add_key_length(config["head_dim"])
            writer.add_value_length(config["head_dim"])
        if arch in ("qwen2", "qwen3", "llama") and config.get("use_sliding_window") and config.get("sliding_window"):
            raise UnsupportedModel(
                f"export_gguf: use_sliding_window: true ({arch}) is not run by llama.cpp as transformers does."
            )


def _gemma_hyperparameters(writer, config: dict, arch: str) -> None:
    size = head_dim(config)
    writer.add_key_length(size)
    writer.add_value_length(size)
    scalar = config.get("query_pre_attn_scalar", size)
    if scalar != size:
        raise UnsupportedModel(
            f"export_gguf: query_pre_attn_scalar {scalar} != head_dim {size}: llama.cpp scales {arch}'s queries "
            "by 1/sqrt(head_dim) (it reads no key for this)."
        )
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(float(config.get("attn_logit_softcapping") or 0.0))
    elif config.get("attn_logit_softcapping"):
        raise UnsupportedModel("export_gguf: gemma3 with attn_logit_softcapping is not run by llama.cpp.")
    if config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
    elif arch == "gemma2":
        writer.add_final_logit_softcapping(0.0)
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if types and all(kind == "full_attention" for kind in types):
        window = None
    if window:
        writer.add_sliding_window(window)
        pattern = SWA_PATTERN[arch]
        expected = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(len(types))]
        if types and list(types) != expected:
            raise UnsupportedModel(
                f"export_gguf: {arch} layer_types {types} differ from llama.cpp's fixed pattern (every "
                f"{pattern}th layer full attention)."
            )
        if arch == "gemma3":
            local = rope_parameters(config, "sliding_attention").get("rope_theta")
            if local is not None:
                writer.add_rope_freq_base_swa(float(local))


def permute_rotary(weights, heads: int):
    """Hugging Face's rotate-half row order -> llama.cpp's interleaved pairs (per head)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def llama3_rope_factors(config: dict):
    """The `rope_freqs` tensor llama.cpp multiplies Llama 3.1's RoPE wavelengths by."""
    import numpy as np

    rope = rope_parameters(config)
    dim = head_dim(config)
    base = rope.get("rope_theta", 10000.0)
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_context = rope.get("original_max_position_embeddings", 8192)
    factors = []
    for index in range(0, dim, 2):
        wavelength = 2 * math.pi * base ** (index / dim)
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def converted_tensors(config: dict, arch: str, tensors, vocab_rows: int):
    """(llama.cpp name, float32 array) for each Hugging Face (name, float32 array) of a causal LM."""
    gguf = gguf_package()
    layers = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], layers)
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    tied = config.get("tie_word_embeddings", arch in ("gemma2", "gemma3"))
    rope = rope_parameters(config)
    if arch == "llama" and rope.get("rope_type") == "llama3":
        yield "rope_freqs.weight", llama3_rope_factors(config)
    for name, data in tensors:
        if name.endswith(("rotary_emb.inv_freq", ".attention.masked_bias")):
            continue
        if name == "lm_head.weight" and tied:
            continue
        if arch == "llama":
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                data = permute_rotary(data, heads)
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                data = permute_rotary(data, kv_heads)
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            data = data + 1
        if name.endswith("embed_tokens.weight") and data.shape[0] > vocab_rows:
            data = data[:vocab_rows]  # Gemma 3 pads its embedding past the tokenizer (llama.cpp's converter trims it)
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise UnsupportedModel(f"export_gguf: tensor {name} of this {arch} model has no llama.cpp name.")
        yield new_name, data
