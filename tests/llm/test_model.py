"""Model loading and the fine-tuning methods on the tiny local Llama (tests/llm/conftest.py)."""

import logging

import pytest
import torch

from lathe.llm.config.train import parse_train_config
from lathe.llm.model.adapters import count_parameters, find_all_linear_modules
from lathe.llm.model.loader import load_model, load_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")


def _config(model_dir, **values):
    return parse_train_config({"model_name_or_path": model_dir, "dataset": "d", "output_dir": "unused", **values})


def _load(model_dir, is_trainable=True, **values):
    from lathe.llm.templates import get_template_and_fix_tokenizer

    config = _config(model_dir, **values)
    tokenizer = load_tokenizer(config.model)
    get_template_and_fix_tokenizer(tokenizer, config.data)
    return tokenizer, load_model(tokenizer, config.model, config.finetuning, is_trainable=is_trainable)


def test_tokenizer_gets_eos_as_pad_and_right_padding(tiny_model_dir):
    from lathe.llm.templates import get_template_and_fix_tokenizer

    config = _config(tiny_model_dir)
    tokenizer = load_tokenizer(config.model)
    assert tokenizer.padding_side == "right"
    assert tokenizer.model_max_length >= 2048
    get_template_and_fix_tokenizer(tokenizer, config.data)
    assert tokenizer.pad_token == tokenizer.eos_token == "</s>"
    # The pad token is the template's EOS, chosen after the template replaced EOS (LLaMA-Factory's order).
    tokenizer = load_tokenizer(_config(tiny_model_dir, template="chatml").model)
    get_template_and_fix_tokenizer(tokenizer, _config(tiny_model_dir, template="chatml").data)
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"


def test_missing_folder_is_a_clear_error(tmp_path):
    config = _config(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="is not a local folder"):
        load_tokenizer(config.model)


def test_from_pretrained_loads_the_saved_weights(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    _, model = _load(tiny_model_dir, finetuning_type="full")
    for (name, a), (_, b) in zip(reference.named_parameters(), model.named_parameters()):
        assert torch.equal(a, b), name
    assert all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters())
    assert model.training and model.config.use_cache is False


def test_train_from_scratch_builds_new_weights(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(123)
    _, model = _load(tiny_model_dir, finetuning_type="full", train_from_scratch=True)
    assert type(model) is type(reference)
    weight = model.model.layers[0].mlp.up_proj.weight
    assert weight.shape == reference.model.layers[0].mlp.up_proj.weight.shape
    assert not torch.equal(weight, reference.model.layers[0].mlp.up_proj.weight)


def test_inference_loading_is_frozen_eval_float32_on_cpu(tiny_model_dir):
    _, model = _load(tiny_model_dir, is_trainable=False, finetuning_type="full")
    assert not model.training
    assert count_parameters(model)[0] == 0
    assert next(model.parameters()).dtype == torch.float32


def test_dtype_and_attention_follow_the_config(tiny_model_dir):
    _, model = _load(
        tiny_model_dir, is_trainable=False, finetuning_type="full", infer_dtype="bfloat16", flash_attn="disabled"
    )
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"
    # Training with bf16 mixed precision: frozen weights in bf16, trainable ones kept in float32.
    _, model = _load(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=1, bf16=True)
    dtypes = {p.requires_grad: p.dtype for p in model.parameters()}
    assert dtypes == {True: torch.float32, False: torch.bfloat16}


def test_fa2_without_flash_attn_falls_back_as_llamafactory(tiny_model_dir, caplog):
    """LLaMA-Factory on a machine without FlashAttention-2: fa2 warns and keeps the model's default attention
    (the run goes on); Gemma 2 (soft-capping) takes eager, for fa2 and auto alike."""
    from transformers.utils import is_flash_attn_2_available

    from lathe.llm.model.loader import attention_implementation

    assert not is_flash_attn_2_available()  # a CPU machine, as in CI
    with caplog.at_level(logging.WARNING, logger="lathe.llm.model.loader"):
        _, model = _load(tiny_model_dir, is_trainable=False, finetuning_type="full", flash_attn="fa2")
    assert "fa2 asks for FlashAttention-2, which is not installed" in caplog.text
    _, default = _load(tiny_model_dir, is_trainable=False, finetuning_type="full", flash_attn="auto")
    assert model.config._attn_implementation == default.config._attn_implementation != "flash_attention_2"
    assert attention_implementation("fa2", "gemma2") == attention_implementation("auto", "gemma2") == "eager"
    assert attention_implementation("auto", "llama") is None
    assert attention_implementation("sdpa", "gemma2") == "sdpa"


def _trainable_names(model):
    return {name for name, p in model.named_parameters() if p.requires_grad}


def test_freeze_last_and_first_layers(tiny_model_dir):
    _, model = _load(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=2)
    layers = {name.split(".")[2] for name in _trainable_names(model)}
    assert layers == {"1", "2"} and all(n.startswith("model.layers.") for n in _trainable_names(model))
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert count_parameters(model)[0] == 2 * per_layer

    _, model = _load(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=-1)
    assert {name.split(".")[2] for name in _trainable_names(model)} == {"0"}
    assert count_parameters(model)[0] == per_layer


def test_freeze_modules_and_extra_modules(tiny_model_dir):
    _, model = _load(
        tiny_model_dir,
        finetuning_type="freeze",
        freeze_trainable_layers=1,
        freeze_trainable_modules="mlp",
        freeze_extra_modules="embed_tokens,norm",
    )
    names = _trainable_names(model)
    norms = {
        f"model.layers.{i}.{norm}.weight" for i in range(3) for norm in ("input_layernorm", "post_attention_layernorm")
    }
    assert (
        names
        == {
            "model.layers.2.mlp.gate_proj.weight",
            "model.layers.2.mlp.up_proj.weight",
            "model.layers.2.mlp.down_proj.weight",
            "model.embed_tokens.weight",
            "model.norm.weight",
        }
        | norms
    )  # as in LLaMA-Factory, "norm" trains every parameter whose name holds it (each layer's norms too)
    with pytest.raises(ValueError, match="no module 'attn'.*choose from .*mlp"):
        _load(tiny_model_dir, finetuning_type="freeze", freeze_trainable_modules="attn")
    with pytest.raises(ValueError, match="freeze_extra_modules: no module 'wte'"):
        _load(tiny_model_dir, finetuning_type="freeze", freeze_extra_modules="wte")


def test_lora_all_targets_every_linear_but_the_head(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert find_all_linear_modules(base) == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]
    _, model = _load(tiny_model_dir, finetuning_type="lora")
    config = model.peft_config["default"]
    assert set(config.target_modules) == set(find_all_linear_modules(base))
    assert (config.r, config.lora_alpha, config.lora_dropout) == (8, 16, 0.0)
    names = _trainable_names(model)
    assert names and all("lora_" in n for n in names)
    assert not any("lm_head" in n for n, _ in model.named_parameters() if "lora_" in n)


def test_lora_all_leaves_out_linear_subclasses_named_otherwise(tiny_model_dir):
    """LLaMA-Factory picks `all`'s layers by class name: an nn.Linear subclass such as Llama 4's Llama4Router (its
    forward returns (scores, logits), which a LoRA wrapper cannot add to) is no target."""
    import torch
    from transformers import AutoModelForCausalLM

    class Llama4Router(torch.nn.Linear):
        pass

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base.model.layers[0].mlp.router = Llama4Router(4, 2)
    assert "router" not in find_all_linear_modules(base) and "q_proj" in find_all_linear_modules(base)


def test_lora_target_list_options_and_bad_name(tiny_model_dir):
    _, model = _load(
        tiny_model_dir,
        finetuning_type="lora",
        lora_target="q_proj,v_proj",
        lora_rank=4,
        use_rslora=True,
        additional_target="lm_head",
    )
    config = model.peft_config["default"]
    assert set(config.target_modules) == {"q_proj", "v_proj"} and config.r == 4 and config.lora_alpha == 8
    assert config.use_rslora and "lm_head" in config.modules_to_save
    assert any("lm_head" in n and "modules_to_save" in n for n in _trainable_names(model))
    with pytest.raises(ValueError, match="lora_target: no module named qkv"):
        _load(tiny_model_dir, finetuning_type="lora", lora_target="qkv")


def test_lora_target_all_refuses_linear_layers_named_by_a_list_index(tiny_model_dir):
    """Gemma 3n keeps linear layers in a list (altup_projections.0): `all` would hand peft the bare name "0", which
    also names the decoder layer layers.0 (LLaMA-Factory 0.9.5 stops on peft's refusal); lathe names the cause. So
    for a linear layer whose name other modules also bear (ERNIE-4.5-VL's `mlp`)."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from lathe.llm.model.lora import resolve_targets

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = SimpleNamespace(finetuning_type="lora", lora_target=["all"], use_llama_pro=False)
    assert "0" not in resolve_targets(model, args)
    model.model.projections = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
    with pytest.raises(ValueError, match=r"^lora_target: all: .* lists \(model.projections.0\), .*q_proj"):
        resolve_targets(model, args)
    # a linear layer named as other modules are (ERNIE-4.5-VL's resampler_model.mlp beside the decoder's MLPs)
    del model.model.projections
    model.model.mlp = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"^lora_target: all: .* named mlp as .*\(model.layers.0.mlp: LlamaMLP\)"):
        resolve_targets(model, args)


def test_lora_adapter_files_are_standard_and_continue(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, model = _load(tiny_model_dir, finetuning_type="lora", lora_target="q_proj")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)  # a non-trivial adapter
    model.save_pretrained(str(tmp_path / "adapter"))
    assert {p.name for p in (tmp_path / "adapter").iterdir()} >= {"adapter_model.safetensors", "adapter_config.json"}

    inputs = torch.tensor([[1, 5, 9, 12]])
    expected = model(input_ids=inputs).logits
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(tmp_path / "adapter"))
    assert torch.allclose(loaded(input_ids=inputs).logits, expected, atol=1e-5)

    # adapter_name_or_path: training continues the same adapter ...
    _, resumed = _load(tiny_model_dir, finetuning_type="lora", adapter_name_or_path=str(tmp_path / "adapter"))
    assert _trainable_names(resumed) and torch.allclose(resumed(input_ids=inputs).logits, expected, atol=1e-5)
    # ... or merges it and starts a new one; for inference it is merged.
    _, fresh = _load(
        tiny_model_dir, finetuning_type="lora", adapter_name_or_path=str(tmp_path / "adapter"), create_new_adapter=True
    )
    assert torch.allclose(fresh(input_ids=inputs).logits, expected, atol=1e-5)
    _, merged = _load(
        tiny_model_dir, is_trainable=False, finetuning_type="lora", adapter_name_or_path=str(tmp_path / "adapter")
    )
    assert not hasattr(merged, "peft_config") and torch.allclose(merged(input_ids=inputs).logits, expected, atol=1e-5)
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        _load(tiny_model_dir, finetuning_type="lora", adapter_name_or_path=str(tmp_path))


def test_added_tokens_resize_the_embeddings(tiny_model_dir):
    tokenizer, model = _load(tiny_model_dir, finetuning_type="full", add_special_tokens="<tool>")
    assert "<tool>" in tokenizer.get_vocab()
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows >= len(tokenizer) and rows % 64 == 0
