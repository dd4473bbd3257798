"""The end of a `lathe train` run: tokens/s counted from the batches' attention masks (the number
transformers' include_num_input_tokens_seen='non_padding' counts), peak memory beside the plan's, and the
files left as transformers / LLaMA-Factory write them."""

import json
import re

import pytest
import torch

from lathe.llm.commands import run_train
from lathe.llm.config import parse_train_config
from lathe.llm.methods.meter import input_token_count, summary_lines

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")]

THROUGHPUT = re.compile(r"throughput: ([\d,]+) tokens in ([\d.]+) s = ([\d,.]+) tokens/s \(non-padding input tokens\)")
MEMORY = re.compile(r"peak memory: measured ([\d,]+) MiB host \(peak RSS\) / plan ([\d,]+) MiB per device")
# With disable_tqdm (as here), transformers' PrinterCallback pops total_flos from the train metrics.
TRANSFORMERS_TRAIN_KEYS = {
    "epoch",
    "train_loss",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("meter_data")
    rows = [
        {"instruction": f"What is {a} plus {b}?" + " Think." * (a % 3), "input": "", "output": f"{a + b}."}
        for a in range(4)
        for b in range(5)
    ]
    (folder / "add.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"add": {"file_name": "add.json"}}))
    return str(folder)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.getbasetemp() / "home"))


def _train(model_dir, data_dir, output_dir, **extra):
    values = {
        "model_name_or_path": model_dir,
        "stage": "sft",
        "finetuning_type": "lora",
        "dataset_dir": data_dir,
        "dataset": "add",
        "template": "chatml",
        "cutoff_len": 32,
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 4,
        "max_steps": 3,
        "logging_steps": 1,
        "save_steps": 100,
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 7,
        **extra,
    }
    run_train(parse_train_config(values))


def test_the_summary_reports_tokens_per_second_and_peak_memory(tiny_model_dir, data_dir, tmp_path, capsys):
    _train(tiny_model_dir, data_dir, tmp_path / "plain")
    out = capsys.readouterr().out
    throughput, memory = THROUGHPUT.search(out), MEMORY.search(out)
    assert throughput and memory, out[-2000:]
    tokens, runtime, rate = (float(throughput[i].replace(",", "")) for i in (1, 2, 3))
    results = json.loads((tmp_path / "plain" / "train_results.json").read_text())
    # printed to 0.01 s (off by up to 0.005), train_runtime to 0.0001 s (up to 0.00005)
    assert runtime == pytest.approx(results["train_runtime"], abs=0.00505 + 1e-9)
    assert rate > 0 and rate == pytest.approx(tokens / results["train_runtime"], rel=1e-3, abs=0.05)
    assert int(memory[1].replace(",", "")) >= 1 and int(memory[2].replace(",", "")) >= 0
    # The files are transformers' and LLaMA-Factory's: no token count unless asked for.
    assert set(results) == TRANSFORMERS_TRAIN_KEYS
    state = json.loads((tmp_path / "plain" / "trainer_state.json").read_text())
    assert state["num_input_tokens_seen"] == 0
    assert not any("num_input_tokens_seen" in entry for entry in state["log_history"])

    # The count is the one transformers keeps with include_num_input_tokens_seen='non_padding'.
    _train(tiny_model_dir, data_dir, tmp_path / "counted", include_num_input_tokens_seen="non_padding")
    counted = json.loads((tmp_path / "counted" / "trainer_state.json").read_text())["num_input_tokens_seen"]
    assert counted > 3 * 4 * 5 and tokens == counted
    again = THROUGHPUT.search(capsys.readouterr().out)
    assert int(again[1].replace(",", "")) == counted


def test_the_token_count_skips_padding_and_counts_packed_sequences():
    ids = torch.ones(2, 5, dtype=torch.long)
    padded = torch.tensor([[1, 1, 1, 0, 0], [1] * 5])
    assert int(input_token_count({"input_ids": ids, "attention_mask": padded})) == 8
    # neat_packing numbers the sequences of a packed row 1, 2, ...: every non-zero entry is a token.
    packed = torch.tensor([[1, 1, 2, 2, 0], [1, 2, 3, 3, 3]])
    assert int(input_token_count({"input_ids": ids, "attention_mask": packed})) == 9
    assert int(input_token_count({"input_ids": ids})) == 10  # no mask: every position
    assert input_token_count({"pixel_values": ids}) is None


def test_summary_lines_without_a_plan():
    throughput, memory = summary_lines(1000, 4.0, None, torch.device("cpu"))
    assert throughput == "throughput: 1,000 tokens in 4.00 s = 250.0 tokens/s (non-padding input tokens)"
    assert memory.startswith("peak memory: measured ") and memory.endswith(" / no plan estimate for this run")
