"""Quantized bases: what the config allows (LLaMA-Factory's rules), what needs a GPU or a package and says
so before loading, and `lathe export` of a QLoRA run (merged into the dequantized base, checked). The
training step losses against LLaMA-Factory are in test_methods.py."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("bitsandbytes")
transformers = pytest.importorskip("transformers")

from lathe.llm.config.train import parse_train_config  # noqa: E402
from lathe.llm.inference.config import parse_infer_config  # noqa: E402
from lathe.llm.model import quantization  # noqa: E402
from lathe.llm.model.loader import load_model, load_tokenizer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
BASE = {"model_name_or_path": "m", "dataset": "d", "quantization_bit": 4}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"quantization_bit": 3}, "bnb quantizes to 4/8 bits, got 3"),
        ({"quantization_method": "eetq", "quantization_bit": 4}, "eetq quantizes to 8 bits"),
        ({"quantization_method": "gptq"}, "quantization_method: expected one of"),
        ({"finetuning_type": "freeze"}, "a quantized base takes adapters only"),
        ({"finetuning_type": "full"}, "a quantized base takes adapters only"),
        ({"pissa_init": True}, "pissa_init .*needs the full-precision weights"),
        ({"resize_vocab": True}, "embeddings of a quantized model cannot be resized"),
        ({"train_from_scratch": True}, "train_from_scratch .*random weights"),
        ({"adapter_name_or_path": "a,b"}, "a quantized model takes a single adapter"),
        ({"adapter_name_or_path": "a", "create_new_adapter": True}, "create_new_adapter .*merge the adapter first"),
        ({"quantization_device_map": "auto"}, "quantization_device_map: auto .*is for inference"),
    ],
)
def test_config_refuses_what_a_quantized_base_cannot_do(values, message):
    with pytest.raises(ValueError, match=message):
        parse_train_config({**BASE, **values})


def test_llamafactory_defaults_and_oft_are_accepted():
    config = parse_train_config(
        {
            **BASE,
            "finetuning_type": "oft",
            "quantization_method": "bnb",
            "quantization_type": "nf4",
            "double_quantization": False,
        }
    )
    assert (config.model.quantization_bit, config.model.double_quantization) == (4, False)
    assert (
        parse_train_config({"model_name_or_path": "m", "dataset": "d", "quantization_bit": None}).model.quantization_bit
        is None
    )


def test_the_plan_names_the_method_and_the_quantization():
    from lathe.llm.config.methods import describe_method

    config = parse_train_config({**BASE, "use_dora": True, "loraplus_lr_ratio": 16})
    assert describe_method(config.model, config.finetuning) == "lora (DoRA, LoRA+ x16) on a 4-bit nf4 bitsandbytes base"
    config = parse_train_config({**BASE, "quantization_bit": 8, "finetuning_type": "oft"})
    assert describe_method(config.model, config.finetuning) == "oft on an 8-bit bitsandbytes base"
    config = parse_train_config(
        {"model_name_or_path": "m", "dataset": "d", "finetuning_type": "freeze", "use_llama_pro": True}
    )
    assert describe_method(config.model, config.finetuning) == "freeze (LLaMA Pro)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
@pytest.mark.parametrize("method", ["hqq", "eetq"])
def test_gpu_only_methods_are_refused_on_the_cpu(tiny_model_dir, method):
    config = parse_train_config(
        {"model_name_or_path": tiny_model_dir, "dataset": "d", "quantization_method": method, "quantization_bit": 8}
    )
    with pytest.raises(
        ValueError, match=f"quantization_method: {method} runs on a GPU only.*use quantization_method: bnb"
    ):
        load_model(load_tokenizer(config.model), config.model, config.finetuning, is_trainable=True)


@pytest.mark.parametrize(
    ("method", "names"), [("gptq", "gptqmodel and optimum"), ("awq", "gptqmodel"), ("aqlm", "aqlm")]
)
def test_prequantized_checkpoint_names_the_missing_package(tiny_model_dir, tmp_path, monkeypatch, method, names):
    import shutil

    folder = tmp_path / method
    shutil.copytree(tiny_model_dir, folder)
    config_file = folder / "config.json"
    saved = json.loads(config_file.read_text())
    saved["quantization_config"] = {"quant_method": method, "bits": 4}
    config_file.write_text(json.dumps(saved))
    monkeypatch.setattr(quantization, "_missing", lambda package: True)  # as on a machine without them
    config = parse_train_config({"model_name_or_path": str(folder), "dataset": "d"})
    with pytest.raises(
        ImportError, match=f"checkpoint quantized with {method.upper()}; loading it needs {names}: pip install"
    ):
        load_model(load_tokenizer(config.model), config.model, config.finetuning, is_trainable=True)


def test_quantized_inference_keeps_the_adapter_apart_and_counts_parameters_unpacked(tiny_model_dir, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    from lathe.llm.model.adapters import count_parameters

    adapter = tmp_path / "adapter"
    get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj"])
    ).save_pretrained(str(adapter))
    config = parse_infer_config(
        {
            "model_name_or_path": tiny_model_dir,
            "template": "chatml",
            "quantization_bit": 4,
            "adapter_name_or_path": str(adapter),
        }
    )
    model = load_model(load_tokenizer(config.model), config.model, config.finetuning, is_trainable=False)
    assert isinstance(model, PeftModel)  # merging into 4-bit weights would round the update away
    plain = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert count_parameters(model)[1] == sum(p.numel() for p in plain.parameters()) + lora


@pytest.mark.slow
def test_export_of_a_qlora_run_merges_into_the_dequantized_base(tmp_path):
    from lathe.llm.commands import run_train
    from lathe.llm.export import export_model
    from tests.llm.golden.make_llamafactory_methods import build_assets, case_config

    assets = build_assets(tmp_path / "assets")
    run = tmp_path / "run"
    run_train(
        parse_train_config(
            {
                **case_config("qlora_nf4", assets, str(run)),
                "lora_target": "q_proj,v_proj,down_proj",
                "max_steps": 3,
                "learning_rate": 0.05,
            }
        )
    )

    def infer_config(name, **values):
        return parse_infer_config(
            {
                "model_name_or_path": assets["model"],
                "template": "qwen",
                "adapter_name_or_path": str(run),
                "export_dir": str(tmp_path / name),
                **values,
            }
        )

    # The trained model: the 4-bit base with the adapter, as training saw it.
    config = infer_config("exported", quantization_bit=4)
    trained = load_model(load_tokenizer(config.model), config.model, config.finetuning, is_trainable=False)
    report = export_model(config)
    assert report.dequantized == "4-bit bnb" and report.merge_error < 1e-3 and report.change_from_base > 1e-5
    assert "quantization_config" not in json.loads((tmp_path / "exported" / "config.json").read_text())
    # Without quantization_bit the adapter merges into the checkpoint's own weights (LLaMA-Factory's way).
    plain = export_model(infer_config("plain"))
    assert plain.dequantized is None and plain.merge_error < 1e-3

    ids = torch.tensor([[1, 9, 40, 77, 3, 12, 60, 2]])
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        errors = {
            name: float(
                (
                    transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / name))(input_ids=ids).logits
                    - expected
                )
                .abs()
                .max()
            )
            for name in ("exported", "plain")
        }
    # dequantize(quantize(W)) + BA is what the quantized layers computed, up to their kernel's rounding (bnb's CPU
    # kernels may compute in bfloat16); the full-precision weights differ from it by the quantization error.
    assert errors["exported"] < 0.02 * float(expected.abs().max()) and errors["exported"] < errors["plain"] / 3
