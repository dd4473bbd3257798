"""Warnings a user of `lathe` sees: each once, pointing at the user's code or config, none from lathe's
insides: warmup_ratio (lathe.train: the user's line; lathe train: a LLaMA-Factory key, read as it is),
bitsandbytes' import-time warning on runs without quantization, and transformers' warnings during a
`lathe chat` reply (after the reply, not inside its text)."""

import logging
import os
import subprocess
import sys
import threading
import warnings
from types import SimpleNamespace

import pytest

from lathe.llm.config import parse_train_config
from lathe.llm.inference.chat import chat_loop


def test_warmup_ratio_in_lathe_train_points_at_the_users_line():
    from lathe.train import TrainingArguments

    with pytest.warns(FutureWarning, match="warmup_ratio") as caught:
        args = TrainingArguments("out", warmup_ratio=0.1, report_to="none")
    assert [os.path.basename(item.filename) for item in caught] == ["test_warnings.py"]
    assert args.warmup_steps == 0.1


def test_warmup_ratio_in_a_llamafactory_config_is_read_without_a_warning(tmp_path, caplog):
    values = {"model_name_or_path": "m", "dataset": "d", "output_dir": str(tmp_path), "warmup_ratio": 0.1}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = parse_train_config(values)
    assert config.training.warmup_steps == 0.1
    assert not [item for item in caught if "warmup" in str(item.message)]
    assert "warmup" not in caplog.text


def test_a_warning_of_the_config_names_the_config_file(tmp_path, write_yaml, caplog):
    path = write_yaml(
        tmp_path / "c.yaml",
        {"model_name_or_path": "m", "dataset": "d", "output_dir": str(tmp_path / "o"), "save_safetensors": False},
    )
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        parse_train_config(path)
    assert not [item for item in caught if "safetensors" in str(item.message)]  # not a Python warning at lathe's line
    lines = [record.getMessage() for record in caplog.records if "save_safetensors" in record.getMessage()]
    assert len(lines) == 1 and str(path) in lines[0], lines


@pytest.mark.slow
def test_no_bitsandbytes_warning_without_quantization(tiny_model_dir, tmp_path, write_yaml):
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.json").write_text('[{"instruction": "hi", "input": "", "output": "hello"}]')
    (data / "dataset_info.json").write_text('{"a": {"file_name": "a.json"}}')
    values = {
        "model_name_or_path": tiny_model_dir,
        "dataset_dir": str(data),
        "dataset": "a",
        "template": "chatml",
        "finetuning_type": "lora",  # imports peft, which imports bitsandbytes
        "output_dir": str(tmp_path / "out"),
        "report_to": "none",
    }
    config = write_yaml(tmp_path / "c.yaml", values)
    env = {**os.environ, "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    for command in (["--help"], ["train", config, "--dry_run"]):
        result = subprocess.run(
            [sys.executable, "-m", "lathe", *command], capture_output=True, text=True, env=env, timeout=300
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert "bitsandbytes" not in result.stderr and "warn" not in result.stderr.lower(), result.stderr[-2000:]


class WarningEngine:
    """A ChatEngine stand-in whose generation thread warns in the middle of the reply, as transformers'
    first forward can (a Python warning and a transformers logger warning)."""

    def media_refusal(self, kind):
        return f"This model takes no {kind} input."

    def chat_inputs(self, messages, read_media=None):
        return [0], {}

    def check_length(self, prompt_ids, params):
        return params

    def default_params(self):
        return None

    def generate(self, prompt_ids, params, on_text, media=None):
        def work():
            on_text("Four")
            warnings.warn("a generation warning", UserWarning)
            logging.getLogger("transformers.generation").warning("a transformers warning")
            on_text(" it is.")

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        return SimpleNamespace(finish_reason="stop", text="Four it is.")


def test_chat_shows_warnings_after_the_reply_and_once(monkeypatch):
    events = []

    class Terminal(logging.Handler):
        def emit(self, record):
            events.append(("log", record.getMessage()))

    logger = logging.getLogger("transformers")
    terminal = Terminal()
    logger.addHandler(terminal)
    monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kwargs: events.append(("warn", str(message))))
    lines = iter(["What is two plus two?", "Again?", "exit"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            chat_loop(
                WarningEngine(), read=lambda _prompt: next(lines), write=lambda text: events.append(("out", text))
            )
    finally:
        logger.removeHandler(terminal)
    first = events.index(("out", "Assistant: "))
    reply = events[first : first + 4]
    assert reply == [("out", "Assistant: "), ("out", "Four"), ("out", " it is."), ("out", "\n")]
    assert events[first + 4 : first + 6] == [("warn", "a generation warning"), ("log", "a transformers warning")]
    # The second reply: the same warnings are not shown again.
    second = events.index(("out", "Assistant: "), first + 1)
    assert [kind for kind, _ in events[second:]] == ["out"] * 4
