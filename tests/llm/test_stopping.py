"""Ctrl-C and SIGTERM in `lathe train`: one line instead of a traceback, a checkpoint at the step that
finished, the resume command, exit code 128 + signal; resuming from that checkpoint ends where an
uninterrupted run ends. The run is a real `lathe train` process, its steps slowed by a sleeping callback."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
import torch

from lathe.llm.commands import run_train
from lathe.llm.config import parse_train_config

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")]

# `lathe train` (lathe.cli.main) with each step slowed down, so that a signal lands mid-run.
SLOW_LATHE = """
import sys, time
import lathe.llm.commands as commands
from lathe.cli import main
from lathe.train.callbacks.events import TrainerCallback

class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(float(sys.argv[1]))

train = commands.run_train
commands.run_train = lambda config, dry_run=False, callbacks=None: train(config, dry_run, [Slow(), *(callbacks or [])])
raise SystemExit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stop_data")
    rows = [
        {"instruction": f"What is {a} plus {b}?", "input": "", "output": f"{a + b}."}
        for a in range(4)
        for b in range(5)
    ]
    (folder / "add.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"add": {"file_name": "add.json"}}))
    return str(folder)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path_factory.getbasetemp() / "home"))


def _values(model_dir, data_dir, output_dir):
    return {
        "model_name_or_path": model_dir,
        "stage": "sft",
        "finetuning_type": "full",
        "dataset_dir": data_dir,
        "dataset": "add",
        "template": "chatml",
        "cutoff_len": 32,
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 4,
        "learning_rate": 1e-3,
        "max_steps": 8,  # 5 steps per epoch: the stop and the resume cross an epoch boundary
        "logging_steps": 1,
        "save_steps": 100,
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 7,
    }


def _start(script, config, step_seconds, tmp_path, new_session=False):
    """`lathe train config` slowed down; with new_session, in a process group of its own (a terminal's job)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    stderr = open(tmp_path / "stderr.txt", "w+")
    process = subprocess.Popen(
        [sys.executable, str(script), str(step_seconds), "train", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=env,
        text=True,
        start_new_session=new_session,
    )
    return process, stderr


def _wait_for(condition, process, timeout=240.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, "lathe train ended before the signal was sent"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _logged_steps(output_dir) -> list[int]:
    path = output_dir / "trainer_log.jsonl"
    if not path.is_file():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]
    return [line["current_steps"] for line in lines if "loss" in line]


def _losses(output_dir) -> dict:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def test_ctrl_c_saves_a_checkpoint_that_resumes_exactly(tiny_model_dir, data_dir, tmp_path, write_yaml):
    """A terminal's Ctrl-C (SIGINT to the process group) with DataLoader workers: the workers (forked with lathe's
    handler) keep serving, the one acknowledgement and the stop come from the main process, and the printed
    command resumes to the uninterrupted run (one run checks both: each `lathe train` process costs seconds)."""
    from safetensors.torch import load_file

    straight = tmp_path / "straight"
    run_train(parse_train_config(_values(tiny_model_dir, data_dir, straight)))

    output = tmp_path / "stopped"
    values = {**_values(tiny_model_dir, data_dir, output), "dataloader_num_workers": 2}
    config = write_yaml(tmp_path / "config.yaml", values)
    script = tmp_path / "slow_lathe.py"
    script.write_text(SLOW_LATHE)
    process, stderr = _start(script, config, 0.4, tmp_path, new_session=True)
    _wait_for(lambda: 2 in _logged_steps(output), process)
    os.killpg(process.pid, signal.SIGINT)
    code = process.wait(timeout=240)
    stderr.seek(0)
    err = stderr.read()

    assert code == 130, err
    assert "Traceback" not in err and err.count("SIGINT received") == 1, err[-2000:]
    assert "SIGINT received: finishing this step, then saving a checkpoint (Ctrl-C again to abort now)." in err
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(
        r"lathe train: stopped by SIGINT after step (\d+) of 8; checkpoint saved in (\S+)\. Resume with: (.+)", last
    )
    assert match, last
    step, checkpoint, command = int(match[1]), match[2], match[3]
    assert 2 <= step < 8 and checkpoint == str(output / f"checkpoint-{step}")
    assert sorted(p.name for p in output.glob("checkpoint-*")) == [f"checkpoint-{step}"]
    assert not (output / "model.safetensors").exists()  # the stopped run is not saved as a finished model
    assert max(_logged_steps(output)) == step
    assert shlex.split(command) == ["lathe", "train", str(config), f"resume_from_checkpoint={checkpoint}"]

    # The printed command, run as printed (without the slowdown; by the command line's main in this process, a new
    # Python costs ~10 CPU s of imports), ends where the uninterrupted run ended.
    from lathe.cli import main

    assert main(shlex.split(command)[1:]) == 0
    reference, final = load_file(straight / "model.safetensors"), load_file(output / "model.safetensors")
    assert reference.keys() == final.keys()
    for name in reference:
        torch.testing.assert_close(final[name], reference[name], rtol=0, atol=1e-6)
    expected = _losses(straight)
    assert sorted(expected) == list(range(1, 9))
    got = _losses(output)
    assert sorted(got) == list(range(1, 9))
    for key in expected:
        assert got[key] == pytest.approx(expected[key], abs=1e-6)
    assert _logged_steps(output) == list(range(1, 9))


def test_a_second_sigterm_aborts_at_once(tiny_model_dir, data_dir, tmp_path, write_yaml):
    output = tmp_path / "out"
    config = write_yaml(tmp_path / "config.yaml", _values(tiny_model_dir, data_dir, output))
    script = tmp_path / "slow_lathe.py"
    script.write_text(SLOW_LATHE)
    process, stderr = _start(script, config, 4.0, tmp_path)  # a long step: both signals land inside it
    _wait_for(lambda: 1 in _logged_steps(output), process)
    process.send_signal(signal.SIGTERM)
    _wait_for(lambda: "SIGTERM received" in (tmp_path / "stderr.txt").read_text(), process)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _wait_for(lambda: "aborted by" in (tmp_path / "stderr.txt").read_text(), process, timeout=60)
    assert time.monotonic() - started < 2.0  # at once, not after the step's 4 seconds
    code = process.wait(timeout=60)
    stderr.seek(0)
    err = stderr.read()
    assert code == 143, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "lathe train: aborted by SIGTERM."
    assert not list(output.glob("checkpoint-*"))
