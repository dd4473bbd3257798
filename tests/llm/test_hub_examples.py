"""LLaMA-Factory's examples/train_lora/qwen3_lora_sft.yaml (v0.9.5), its keys written here unchanged, runs with
`lathe train` when its model, Qwen/Qwen3-4B-Instruct-2507, is in the local Hugging Face cache: a tiny
Qwen3-shaped model under that id, stand-in `identity` / `alpaca_en_demo` data in `data/` beside the config,
offline; only max_steps is given on the command line, as a LLaMA-Factory user would."""

import json
import os
import subprocess
import sys

import pytest

from tests.llm.hub_cache import put_in_hub_cache

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_ID = "Qwen/Qwen3-4B-Instruct-2507"
# The example's keys and values (LLaMA-Factory v0.9.5, examples/train_lora/qwen3_lora_sft.yaml), not a copy of
# the file: the test checks that a config of exactly these keys needs no change.
EXAMPLE = {
    "model_name_or_path": MODEL_ID,
    "trust_remote_code": True,
    "stage": "sft",
    "do_train": True,
    "finetuning_type": "lora",
    "lora_rank": 8,
    "lora_target": "all",
    "dataset": "identity,alpaca_en_demo",
    "template": "qwen3_nothink",
    "cutoff_len": 2048,
    "max_samples": 1000,
    "preprocessing_num_workers": 16,
    "dataloader_num_workers": 4,
    "output_dir": "saves/qwen3-4b/lora/sft",
    "logging_steps": 10,
    "save_steps": 500,
    "plot_loss": True,
    "overwrite_output_dir": True,
    "save_only_model": False,
    "report_to": "none",
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 8,
    "learning_rate": 1.0e-4,
    "num_train_epochs": 3.0,
    "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.1,
    "bf16": True,
    "ddp_timeout": 180000000,
    "resume_from_checkpoint": None,
}
QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def build_tiny_qwen3(folder, texts) -> None:
    """A 2-layer Qwen3 (hidden 32) and a byte-level BPE with Qwen's special tokens: eos <|im_end|>, pad
    <|endoftext|>, no bos, and the think / tool markers as added tokens."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=QWEN_SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_tokens(QWEN_ADDED_TOKENS)
    tokenizer.save_pretrained(str(folder))
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(str(folder))


def stand_in_data(data_dir) -> list[str]:
    """identity / alpaca_en_demo as LLaMA-Factory's data/ registers them (alpaca files), with rows made here."""
    identity = [
        {"instruction": f"Who are you? ({i})", "input": "", "output": f"I am a tiny test model, number {i}."}
        for i in range(6)
    ]
    alpaca = [
        {"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"{i} plus {i + 1} is {2 * i + 1}."}
        for i in range(10)
    ]
    data_dir.mkdir()
    (data_dir / "identity.json").write_text(json.dumps(identity))
    (data_dir / "alpaca_en_demo.json").write_text(json.dumps(alpaca))
    registry = {"identity": {"file_name": "identity.json"}, "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"}}
    (data_dir / "dataset_info.json").write_text(json.dumps(registry))
    return [row[key] for row in identity + alpaca for key in ("instruction", "output")]


@pytest.mark.slow
def test_qwen3_lora_sft_example_runs_unchanged_from_the_hub_cache(tmp_path, write_yaml):
    texts = stand_in_data(tmp_path / "data")
    build_tiny_qwen3(tmp_path / "model", texts * 4 + ["user assistant system"])
    hf_home = tmp_path / "hf"
    put_in_hub_cache(tmp_path / "model", hf_home / "hub", MODEL_ID)
    config = write_yaml(tmp_path / "qwen3_lora_sft.yaml", EXAMPLE)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, HF_HUB_OFFLINE="1", HF_HOME=str(hf_home), OMP_NUM_THREADS="1")
    env.pop("HF_HUB_CACHE", None)
    result = subprocess.run(
        [sys.executable, "-m", "lathe", "train", config, "max_steps=2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = tmp_path / "saves" / "qwen3-4b" / "lora" / "sft"
    adapter = json.loads((output / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == MODEL_ID  # as when LLaMA-Factory loads the id
    assert adapter["r"] == 8
    assert (output / "adapter_model.safetensors").is_file()
    state = json.loads((output / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    losses = [entry["train_loss"] for entry in state["log_history"] if "train_loss" in entry]
    assert losses and all(loss == loss and 0 < loss < 20 for loss in losses)
