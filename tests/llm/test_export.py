"""`lathe export`: a LoRA run merged into its base, cast, sharded, written with its tokenizer and stop
tokens, and checked; the folder loads with plain transformers and gives the same logits as base +
adapter, renders conversations with the same token ids as lathe's template, and an adapter that
changes nothing is an error."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.llm.runs import trained_lora_adapter

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from lathe.llm.export import export_command, export_model  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
from lathe.llm.inference.config import parse_infer_config  # noqa: E402
from lathe.llm.inference.loading import load_tokenizer_and_template  # noqa: E402

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Two plus two is four."},
    {"role": "user", "content": "Reverse abc."},
]


def chat_ids(tokenizer, messages, **kwargs) -> list[int]:
    """apply_chat_template's token ids (transformers 5 returns a BatchEncoding by default)."""
    return list(tokenizer.apply_chat_template(messages, return_dict=True, **kwargs)["input_ids"])


def make_adapter(model_dir: str, folder, trained: bool = True) -> str:
    """A LoRA adapter of the tiny model; `trained`: its B matrices are non-zero (as after training)."""
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    )
    if trained:
        torch.manual_seed(3)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0, 0.5)
    model.save_pretrained(str(folder))
    return str(folder)


def config_for(model_dir, export_dir, **extra):
    values = {
        "model_name_or_path": model_dir,
        "template": "chatml",
        "finetuning_type": "lora",
        "export_dir": str(export_dir),
    }
    values.update(extra)
    return values


def reference_logits(model_dir, adapter, input_ids):
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        base_logits = base(input_ids=input_ids).logits
        with_adapter = peft.PeftModel.from_pretrained(base, adapter).eval()
        return base_logits, with_adapter(input_ids=input_ids).logits


def test_lora_export_round_trip_loads_with_transformers_and_equals_base_plus_adapter(tiny_model_dir, tmp_path):
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    export_dir = tmp_path / "exported"
    report = export_model(
        parse_infer_config(config_for(tiny_model_dir, export_dir, adapter_name_or_path=adapter), command="export")
    )
    assert report.merged_adapters == [adapter] and report.merge_error < 1e-5 and report.change_from_base > 1e-3

    exported = transformers.AutoModelForCausalLM.from_pretrained(str(export_dir)).eval()
    assert not any("lora" in name for name, _ in exported.named_parameters())
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(export_dir))
    input_ids = torch.tensor([chat_ids(tokenizer, CONVERSATION, add_generation_prompt=True)])
    base_logits, adapter_logits = reference_logits(tiny_model_dir, adapter, input_ids)
    with torch.no_grad():
        logits = exported(input_ids=input_ids).logits
    torch.testing.assert_close(logits, adapter_logits, atol=1e-4, rtol=1e-4)
    assert (logits - base_logits).abs().max() > 1e-2  # the merge did something

    # Stop tokens: chatml stops on <|im_end|>, which the tokenizer and generation config both carry.
    generation = json.loads((export_dir / "generation_config.json").read_text())
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>"
    assert im_end in (
        generation["eos_token_id"] if isinstance(generation["eos_token_id"], list) else [generation["eos_token_id"]]
    )


def test_the_exported_chat_template_renders_like_lathes_template(tiny_model_dir, tmp_path):
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    config = parse_infer_config(
        config_for(tiny_model_dir, tmp_path / "exported", adapter_name_or_path=adapter), command="export"
    )
    export_model(config)
    lathe_tokenizer, template = load_tokenizer_and_template(config)
    # lathe's templates take the system message apart from the turns, as its data converters do
    system, turns = CONVERSATION[0]["content"], CONVERSATION[1:]
    prompt_ids, response_ids = template.encode_oneturn(
        lathe_tokenizer, turns + [{"role": "assistant", "content": "cba"}], system=system
    )
    exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "exported"))
    full = CONVERSATION + [{"role": "assistant", "content": "cba"}]
    assert chat_ids(exported, CONVERSATION, add_generation_prompt=True) == prompt_ids
    assert chat_ids(exported, full)[: len(prompt_ids) + len(response_ids)] == prompt_ids + response_ids


def test_shards_are_at_most_export_size_and_indexed(tiny_model_dir, tmp_path):
    export_dir = tmp_path / "exported"
    # the tiny model is ~0.25 MB in float32: 0.0001 GB = 100 kB shards
    report = export_model(
        parse_infer_config(
            config_for(tiny_model_dir, export_dir, finetuning_type="full", export_size=0.0001), command="export"
        )
    )
    shards = sorted(p for p in os.listdir(export_dir) if p.endswith(".safetensors"))
    assert report.shards == len(shards) >= 2
    index = json.loads((export_dir / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(export_dir))
    original = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for name, tensor in original.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name


def test_export_casts_to_infer_dtype(tiny_model_dir, tmp_path):
    export_dir = tmp_path / "exported"
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    report = export_model(
        parse_infer_config(
            config_for(tiny_model_dir, export_dir, adapter_name_or_path=adapter, infer_dtype="bfloat16"),
            command="export",
        )
    )
    assert report.dtype == "bfloat16"
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(export_dir), dtype="auto")
    assert {p.dtype for p in exported.parameters()} == {torch.bfloat16}


def test_an_adapter_that_changes_nothing_is_an_error_and_nothing_is_written(tiny_model_dir, tmp_path):
    adapter = make_adapter(tiny_model_dir, tmp_path / "untrained", trained=False)  # B = 0: merge is a no-op
    export_dir = tmp_path / "exported"
    with pytest.raises(RuntimeError, match="changes nothing"):
        export_model(
            parse_infer_config(config_for(tiny_model_dir, export_dir, adapter_name_or_path=adapter), command="export")
        )
    assert not export_dir.exists()


def test_config_errors_name_the_key(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="export_dir is required"):
        export_model(parse_infer_config(config_for(tiny_model_dir, ""), command="export"))
    with pytest.raises(ValueError, match="learning_rate .*training key"):
        parse_infer_config(config_for(tiny_model_dir, tmp_path / "x", learning_rate=1e-4), command="export")
    with pytest.raises(ValueError, match="did you mean 'export_size'"):
        parse_infer_config(config_for(tiny_model_dir, tmp_path / "x", export_sise=2), command="export")
    with pytest.raises(ValueError, match="adapter_name_or_path.*finetuning_type: lora"):
        parse_infer_config(config_for(tiny_model_dir, tmp_path / "x", adapter_name_or_path="a", finetuning_type="full"))
    with pytest.raises(ValueError, match="export_quantization_bit .*GPTQ quantization while exporting.*not support"):
        parse_infer_config(config_for(tiny_model_dir, tmp_path / "x", export_quantization_bit=4))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        export_model(parse_infer_config(config_for(tiny_model_dir, tmp_path / "full", finetuning_type="full")))


@pytest.mark.slow
def test_lathe_export_command_line(tiny_model_dir, tmp_path, write_yaml, capfd):
    """`lathe export CONFIG KEY=VALUE` through the command line's own main (in this process: a new Python costs
    ~10 s of imports; `python -m lathe` itself is run by the quickstart and launch tests)."""
    from lathe.cli import main

    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    config = write_yaml(
        tmp_path / "export.yaml", config_for(tiny_model_dir, tmp_path / "exported", adapter_name_or_path=adapter)
    )
    capfd.readouterr()
    assert main(["export", config, "export_size=1"]) == 0
    out, err = capfd.readouterr()
    assert "Exported to" in out and "merge check" in out, err[-2000:]
    assert (tmp_path / "exported" / "model.safetensors").is_file()
    assert main(["export", config, "export_dir="]) == 2
    _, err = capfd.readouterr()
    assert "export_dir is required" in err and "Traceback" not in err


def test_export_command_reads_a_file(tiny_model_dir, tmp_path, write_yaml):
    config = write_yaml(
        tmp_path / "export.yaml", config_for(tiny_model_dir, tmp_path / "exported", finetuning_type="full")
    )
    report = export_command(config, ["infer_dtype=float32"])
    assert report.dtype == "float32" and report.merged_adapters == []


@pytest.mark.slow
def test_a_trained_lora_run_exports_to_the_model_it_trained(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the tokenization cache
    run_dir = trained_lora_adapter(tiny_model_dir, tmp_path)
    export_dir = tmp_path / "exported"
    export_model(
        parse_infer_config(config_for(tiny_model_dir, export_dir, adapter_name_or_path=run_dir), command="export")
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(export_dir))
    input_ids = torch.tensor(
        [chat_ids(tokenizer, [{"role": "user", "content": "What is 2 plus 3?"}], add_generation_prompt=True)]
    )
    _, adapter_logits = reference_logits(tiny_model_dir, run_dir, input_ids)
    with torch.no_grad():
        logits = transformers.AutoModelForCausalLM.from_pretrained(str(export_dir))(input_ids=input_ids).logits
    torch.testing.assert_close(logits, adapter_logits, atol=1e-4, rtol=1e-4)
