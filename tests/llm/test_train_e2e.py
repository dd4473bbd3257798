"""`lathe train` end to end on the tiny Llama: pt and sft x full/freeze/lora, a few CPU steps each,
the output folder checked, LoRA resume, prediction, and the CLI's plan and dry run."""

import json
import os
import random
import shutil
import subprocess

import pytest
import torch

from lathe.llm.commands import run_train
from lathe.llm.config.train import parse_train_config

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """An alpaca addition task and a text file of documents, registered in dataset_info.json."""
    folder = tmp_path_factory.mktemp("e2e_data")
    rng = random.Random(0)
    rows = []
    for _ in range(40):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"instruction": f"What is {a} plus {b}?", "input": "", "output": f"{a} plus {b} is {a + b}."})
    (folder / "add.json").write_text(json.dumps(rows))
    (folder / "docs.txt").write_text("\n".join(f"The quick brown fox jumps over the lazy dog {i}." for i in range(60)))
    (folder / "dataset_info.json").write_text(
        json.dumps(
            {
                "add": {"file_name": "add.json"},
                "docs": {"file_name": "docs.txt", "columns": {"prompt": "text"}},
            }
        )
    )
    return str(folder)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    # The tokenization cache lives under ~/.cache/lathe: keep it inside pytest's folder.
    monkeypatch.setenv("HOME", str(tmp_path_factory.getbasetemp() / "home"))


def _values(model_dir, data_dir, output_dir, stage, method, **extra):
    values = {
        "model_name_or_path": model_dir,
        "stage": stage,
        "finetuning_type": method,
        "dataset_dir": data_dir,
        "dataset": "docs" if stage == "pt" else "add",
        "template": "chatml",
        "cutoff_len": 32,
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 4,
        "learning_rate": 1e-3,
        "max_steps": 4,
        "logging_steps": 1,
        "save_steps": 2,
        "val_size": 0.2,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "plot_loss": True,
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 7,
        "freeze_trainable_layers": 1,
    }
    values.update(extra)
    return values


def _train(model_dir, data_dir, output_dir, stage, method, **extra):
    config = parse_train_config(_values(model_dir, data_dir, output_dir, stage, method, **extra))
    return run_train(config)


def _needs(stage):
    if stage == "pt":
        pytest.importorskip("lathe.llm.data.pretrain", reason="the pre-training processor has not landed yet")
    else:
        pytest.importorskip("lathe.llm.data.collator", reason="the SFT collator has not landed yet")


COMMON_FILES = {
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "trainer_log.jsonl",
    "train_results.json",
    "eval_results.json",
    "all_results.json",
    "trainer_state.json",
    "training_loss.png",
    "training_eval_loss.png",
    "lathe_train_config.yaml",
    "checkpoint-2",
    "checkpoint-4",
}


@pytest.mark.parametrize("stage", ["pt", "sft"])
@pytest.mark.parametrize("method", ["full", "freeze", "lora"])
def test_train_writes_the_expected_outputs(tiny_model_dir, data_dir, tmp_path, stage, method):
    _needs(stage)
    pytest.importorskip("matplotlib")
    output = tmp_path / "out"
    metrics = _train(tiny_model_dir, data_dir, output, stage, method)
    files = {path.name for path in output.iterdir()}
    weights = (
        {"adapter_model.safetensors", "adapter_config.json"}
        if method == "lora"
        else {"model.safetensors", "config.json"}
    )
    assert COMMON_FILES | weights <= files, sorted(files)
    if method == "lora":
        assert "model.safetensors" not in files
    assert torch.isfinite(torch.tensor(metrics["train_loss"]))
    assert "eval_loss" in metrics and ("eval_perplexity" in metrics) == (stage == "pt")

    log = [json.loads(line) for line in (output / "trainer_log.jsonl").read_text().splitlines()]
    losses = [line for line in log if "loss" in line]
    assert [line["current_steps"] for line in losses] == [1, 2, 3, 4]
    assert all(line["total_steps"] == 4 for line in log)
    assert any("eval_loss" in line for line in log)

    # The template's stop tokens (chatml: <|im_end|> as EOS, then <|im_start|>) go with the model.
    generation = json.loads((output / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [4, 3]
    tokenizer_config = json.loads((output / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert "chat_template.jinja" in files or "chat_template" in tokenizer_config
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        json.loads((output / name).read_text())
    with open(output / "training_loss.png", "rb") as f:
        assert f.read(4) == b"\x89PNG"


@pytest.mark.parametrize("neat_packing", [False, True])
def test_sft_with_packing_trains(tiny_model_dir, data_dir, tmp_path, neat_packing):
    _needs("sft")
    pytest.importorskip("lathe.llm.data.packing", reason="sft packing has not landed yet")
    metrics = _train(
        tiny_model_dir,
        data_dir,
        tmp_path / "out",
        "sft",
        "lora",
        packing=True,
        neat_packing=neat_packing,
        cutoff_len=64,
        plot_loss=False,
    )
    assert torch.isfinite(torch.tensor([metrics["train_loss"], metrics["eval_loss"]])).all()


def test_activation_checkpointing_gives_the_same_lora_update(tiny_model_dir, data_dir, tmp_path):
    _needs("sft")
    extra = {"plot_loss": False, "max_steps": 2, "eval_strategy": "no", "val_size": 0.0}
    _train(tiny_model_dir, data_dir, tmp_path / "plain", "sft", "lora", **extra)
    _train(tiny_model_dir, data_dir, tmp_path / "checkpointed", "sft", "lora", activation_checkpointing=True, **extra)
    plain, checkpointed = _adapter(tmp_path / "plain"), _adapter(tmp_path / "checkpointed")
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=1e-6)
    assert any(not torch.equal(value, torch.zeros_like(value)) for name, value in plain.items() if "lora_B" in name)


def test_enable_liger_kernel_without_liger_trains_with_the_chunked_loss_and_says_so(
    tiny_model_dir, data_dir, tmp_path, caplog
):
    """On a CPU (LLaMA-Factory would stop: Liger's kernels need Triton on a GPU) lathe trains with its chunked
    cross-entropy, which gives the same update as the default run, and logs why."""
    import logging

    _needs("sft")
    extra = {"plot_loss": False, "max_steps": 2, "eval_strategy": "no", "val_size": 0.0}
    with caplog.at_level(logging.INFO, logger="lathe.train.loss.causal_lm"):
        _train(tiny_model_dir, data_dir, tmp_path / "liger", "sft", "lora", enable_liger_kernel=True, **extra)
    assert "use_liger_kernel: " in caplog.text and "using lathe's chunked cross-entropy instead" in caplog.text
    _train(tiny_model_dir, data_dir, tmp_path / "plain", "sft", "lora", **extra)
    liger, plain = _adapter(tmp_path / "liger"), _adapter(tmp_path / "plain")
    for name in plain:
        torch.testing.assert_close(liger[name], plain[name], rtol=0, atol=1e-6)


def test_freeze_trains_only_the_chosen_layer(tiny_model_dir, data_dir, tmp_path):
    _needs("sft")
    from safetensors.torch import load_file

    _train(
        tiny_model_dir,
        data_dir,
        tmp_path / "out",
        "sft",
        "freeze",
        plot_loss=False,
        val_size=0.0,
        eval_strategy="no",
        freeze_trainable_layers=1,
    )
    before = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    after = load_file(str(tmp_path / "out" / "model.safetensors"))
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all(name.startswith("model.layers.2.") for name in changed)


def test_lora_output_loads_in_peft(tiny_model_dir, data_dir, tmp_path):
    _needs("sft")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _train(tiny_model_dir, data_dir, tmp_path / "out", "sft", "lora", plot_loss=False)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(tmp_path / "out"))
    assert model(input_ids=torch.tensor([[1, 5, 9]])).logits.shape[-1] >= 300


def _adapter(folder):
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "adapter_model.safetensors"))


def test_lora_resume_matches_an_uninterrupted_run(tiny_model_dir, data_dir, tmp_path):
    _needs("sft")
    extra = {"plot_loss": False, "max_steps": 6, "save_steps": 3, "eval_steps": 3}
    _train(tiny_model_dir, data_dir, tmp_path / "straight", "sft", "lora", **extra)

    interrupted = tmp_path / "interrupted"
    _train(tiny_model_dir, data_dir, interrupted, "sft", "lora", **extra)
    # Pretend the run died after checkpoint-3: its later checkpoint never happened.
    shutil.rmtree(interrupted / "checkpoint-6")
    explicit = tmp_path / "explicit"
    shutil.copytree(interrupted, explicit)

    # LLaMA-Factory's rule: training into an output_dir with checkpoints resumes from the last one ...
    _train(tiny_model_dir, data_dir, interrupted, "sft", "lora", **extra)
    # ... and resume_from_checkpoint names one explicitly.
    _train(
        tiny_model_dir,
        data_dir,
        explicit,
        "sft",
        "lora",
        resume_from_checkpoint=str(explicit / "checkpoint-3"),
        **extra,
    )

    reference = _adapter(tmp_path / "straight")
    for folder in (interrupted, explicit):
        resumed = _adapter(folder)
        assert reference.keys() == resumed.keys()
        for name in reference:
            torch.testing.assert_close(resumed[name], reference[name], rtol=0, atol=1e-6)
        steps = [
            json.loads(line)["current_steps"]
            for line in (folder / "trainer_log.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)
        ]
        assert steps == [1, 2, 3, 4, 5, 6]  # the lines of the lost steps were replaced, not duplicated


def test_finished_model_without_checkpoints_is_not_overwritten(tiny_model_dir, data_dir, tmp_path):
    _needs("sft")
    output = tmp_path / "out"
    output.mkdir()
    shutil.copy(os.path.join(tiny_model_dir, "model.safetensors"), output / "model.safetensors")
    with pytest.raises(ValueError, match="overwrite_output_dir"):
        _train(tiny_model_dir, data_dir, output, "sft", "full")
    _train(tiny_model_dir, data_dir, output, "sft", "full", overwrite_output_dir=True, plot_loss=False, max_steps=1)


def test_predict_writes_generated_predictions(tiny_model_dir, data_dir, tmp_path):
    _needs("sft")
    output = tmp_path / "out"
    metrics = _train(
        tiny_model_dir,
        data_dir,
        output,
        "sft",
        "lora",
        plot_loss=False,
        do_predict=True,
        predict_with_generate=True,
        eval_strategy="no",
        max_new_tokens=6,
        do_sample=False,
    )
    lines = [json.loads(line) for line in (output / "generated_predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and set(lines[0]) == {"prompt", "predict", "label"}
    # LLaMA-Factory's format: the label as decoded (chatml's newline after <|im_end|> kept), the prompt with its markers.
    assert (
        lines[0]["label"].endswith(".\n")
        and lines[0]["prompt"].startswith("<|im_start|>")
        and "plus" in lines[0]["prompt"]
    )
    assert 0 <= metrics["predict_exact_match"] <= 100
    assert "predict_exact_match" in json.loads((output / "predict_results.json").read_text())


@pytest.fixture
def cli(capfd):
    """`lathe ARGS` run by the command line's own main in this process: its exit status and what reached the
    terminal (file descriptors 1 and 2), as a finished process. A new Python per command cost 8-10 CPU seconds of
    imports here; `python -m lathe` itself is run by the quickstart, launch and chat tests."""
    from lathe.cli import main

    def run(*args):
        capfd.readouterr()
        try:
            code = main(list(args))
        except SystemExit as stop:  # argparse's errors
            code = stop.code
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["lathe", *args], code, out, err)

    return run


def test_cli_dry_run_prints_config_and_plan(tiny_model_dir, data_dir, tmp_path, write_yaml, cli):
    values = _values(tiny_model_dir, data_dir, tmp_path / "out", "sft", "lora")
    path = write_yaml(tmp_path / "config.yaml", values)
    result = cli("train", path, "lora_rank=4", "--dry_run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # the keys set (a command-line override too); lora_alpha resolves to 2 x rank as in LLaMA-Factory: not listed
    assert "lora_rank: 4" in out and "lora_alpha" not in out
    assert "train examples  32" in out and "eval examples   8" in out
    assert "steps           8 per epoch, 4 in total" in out
    assert "evaluate: every 2 steps" in out and "save: every 2 steps" in out
    assert "trainable of" in out and "Dry run: nothing was trained." in out
    assert not (tmp_path / "out").exists()


def test_cli_reports_config_errors_without_a_traceback(tmp_path, write_yaml, cli):
    path = write_yaml(tmp_path / "config.yaml", {"model_name_or_path": "m", "dataset": "d", "lora_rnak": 4})
    result = cli("train", path)
    assert result.returncode == 2
    assert "Unknown key 'lora_rnak'" in result.stderr and "did you mean 'lora_rank'" in result.stderr
    assert "Traceback" not in result.stderr
    path = write_yaml(tmp_path / "ppo.yaml", {"model_name_or_path": "m", "dataset": "d", "stage": "ppo"})
    result = cli("train", path)
    assert result.returncode == 2 and "stage 'ppo'" in result.stderr and "is not supported yet" in result.stderr


def test_cli_data_preview_marks_trained_spans(tiny_model_dir, data_dir, tmp_path, write_yaml, cli):
    values = _values(tiny_model_dir, data_dir, tmp_path / "out", "sft", "lora")
    path = write_yaml(tmp_path / "config.yaml", values)
    result = cli("data", "preview", path, "-n", "2")
    assert result.returncode == 0, result.stderr
    assert "[[" in result.stdout and "trained" in result.stdout
    assert result.stdout.count("--- example") == 2
    # the template report: stop tokens and the saved chat_template's agreement with the training template
    assert (
        "template: chatml" in result.stdout
        and "stop tokens (generation_config eos_token_id): '<|im_end|>'" in result.stdout
    )
    assert "chat_template: renders the probe conversations exactly as the template trains on them" in result.stdout
