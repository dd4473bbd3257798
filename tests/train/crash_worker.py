"""A training job that test_crash_safety.py kills with real signals, and the fork server that runs it.

`python crash_worker.py serve` imports torch and lathe once, then answers JSON lines on stdin:

    {"cmd": "start", "output_dir": ..., "options": {...}}  -> {"pid": ...}   fork a child that trains
    {"cmd": "signal", "signal": 9}                         -> {"returncode": ..., "elapsed": ...}
    {"cmd": "wait"}                                        -> {"returncode": ..., "elapsed": ...}

Why a fork server: on 2 shared cores `import torch` alone takes 2-6 s of wall time, and the kill
test restarts training dozens of times. Each child is a separate process that is killed for real
(SIGKILL: no cleanup, no flushing, no `finally`); what it shares with the others is only the
imported modules, never training state, which it must read back from its checkpoints.

A child trains a small MLP with dropout on a shuffled sampler, saving often (rotation runs too),
resuming with `resume_from_checkpoint=True` whenever output_dir holds a checkpoint. It writes its
final weights to `final.safetensors` and exits 0. Options (all optional):

    save_steps, save_total_limit, epochs   the job's TrainingArguments
    slow_fsync_ms                          sleep before every os.fsync: saves take longer, so random
                                           kills land inside them more often
    crash: [phase, n]                      SIGKILL itself at the n-th time it reaches `phase` (below)
    graceful: true                         add GracefulStopCallback, save only when it asks
    started_file                           graceful: touched at the end of step 3, which then waits
                                           for the signal
A returncode of -N means killed by signal N (as in subprocess).
"""

from __future__ import annotations

import importlib
import io
import json
import os
import shutil
import signal
import sys
import time
import traceback

import torch
from torch import nn

from lathe import Trainer, TrainerCallback, TrainingArguments
from lathe.train.callbacks.flow import GracefulStopCallback
from lathe.train.checkpoints import layout as ckpt
from lathe.train.checkpoints import rotation

# Where a child can kill itself mid-save. Each names a moment of checkpoint.atomic_checkpoint /
# Trainer._save_checkpoint, so a test can hit exactly the windows random kills rarely find.
CRASH_PHASES = (
    "mid_write",  # half of a torch.save file written into the staging folder
    "before_manifest",  # every file written, no manifest yet
    "before_rename",  # manifest written and fsynced, staging folder not yet renamed
    "before_rotation",  # checkpoint-N published, older ones not yet rotated away
    "mid_rotation",  # part of an older checkpoint's files deleted
    "after_save",  # checkpoint committed and rotated, on_save ran
)


class Regressor(nn.Module):
    """Dropout makes the result depend on the RNG stream, so resume must restore it exactly."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def forward(self, x, labels=None):
        prediction = self.net(x).squeeze(-1)
        return {"loss": ((prediction - labels) ** 2).mean(), "logits": prediction}


def dataset(count: int = 48) -> list[dict]:
    generator = torch.Generator().manual_seed(123)
    x = torch.randn(count, 8, generator=generator)
    y = x.sum(dim=1) + 0.1 * torch.randn(count, generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(count)]


class ProgressCallback(TrainerCallback):
    """Records each committed save (the test checks a kill never loses one). With `graceful`, at
    the end of step 3 it touches `started_file` and waits for the signal the test then sends, so
    the stop lands mid-epoch at a known step however loaded the machine is."""

    def __init__(self, output_dir: str, started_file: str | None = None, graceful=None):
        self.saved_log = os.path.join(output_dir, "saved_steps.txt")
        self.started_file = started_file
        self.graceful = graceful

    def on_step_end(self, args, state, control, **kwargs):
        if self.graceful is not None and self.started_file and state.global_step == 3:
            with open(self.started_file, "w") as f:
                f.write(f"{os.getpid()}\n")
            deadline = time.monotonic() + 60
            while not self.graceful.stop_requested and time.monotonic() < deadline:
                time.sleep(0.01)  # the signal handler runs between these sleeps

    def on_save(self, args, state, control, **kwargs):
        with open(self.saved_log, "a") as f:
            f.write(f"{state.global_step}\n")


def _kill_myself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install_crash(phase: str, nth: int) -> None:
    """Patch lathe's checkpoint code in this child so it SIGKILLs itself at the nth `phase`."""
    if phase not in CRASH_PHASES:
        raise ValueError(f"unknown crash phase {phase!r}")
    count = {"n": 0}

    def due() -> bool:
        count["n"] += 1
        return count["n"] == nth

    if phase == "mid_write":
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)) and due():
                buffer = io.BytesIO()
                real_save(obj, buffer, *args, **kwargs)
                with open(f, "wb") as out:
                    out.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                _kill_myself()
            return real_save(obj, f, *args, **kwargs)

        torch.save = save
    elif phase == "before_manifest":
        real_manifest = ckpt._write_manifest

        def write_manifest(folder, *args, **kwargs):
            if due():
                _kill_myself()
            return real_manifest(folder, *args, **kwargs)

        ckpt._write_manifest = write_manifest
    elif phase == "before_rename":
        real_fsync_tree = ckpt._fsync_tree

        def fsync_tree(folder):
            real_fsync_tree(folder)
            if due():
                _kill_myself()

        ckpt._fsync_tree = fsync_tree
    elif phase == "before_rotation":
        real_rotate = rotation.rotate_checkpoints

        def rotate(*args, **kwargs):
            if due():
                _kill_myself()
            return real_rotate(*args, **kwargs)

        rotation.rotate_checkpoints = rotate
    elif phase == "mid_rotation":
        real_rmtree = shutil.rmtree

        def rmtree(path, *args, **kwargs):
            name = os.path.basename(os.fspath(path).rstrip(os.sep))
            # Deleting an older checkpoint (under whatever name rotation gives it), not a staging
            # folder left by this save.
            if not name.startswith(ckpt.STAGING_PREFIX + ckpt.PREFIX_CHECKPOINT_DIR) and os.path.isdir(path) and due():
                for root, _dirs, files in os.walk(path):
                    for file in sorted(files)[:2]:
                        os.remove(os.path.join(root, file))
                    break
                _kill_myself()
            return real_rmtree(path, *args, **kwargs)

        shutil.rmtree = rmtree


def build_trainer(output_dir: str, options: dict, callbacks=(), **trainer_kwargs) -> Trainer:
    """The job's Trainer; options["args"] overrides TrainingArguments and trainer_kwargs go to
    Trainer (the in-process tests use both)."""
    arguments = dict(
        output_dir=output_dir,
        per_device_train_batch_size=4,
        num_train_epochs=options.get("epochs", 2),
        learning_rate=0.01,
        logging_steps=1,
        save_strategy="no" if options.get("graceful") else "steps",
        save_steps=options.get("save_steps", 1),
        save_total_limit=options.get("save_total_limit", 2),
        seed=7,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    arguments.update(options.get("args", {}))
    torch.manual_seed(0)  # the initial weights must not depend on what ran before in this process
    return Trainer(
        model=Regressor(),
        args=TrainingArguments(**arguments),
        train_dataset=dataset(),
        callbacks=list(callbacks),
        **trainer_kwargs,
    )


def train_job(output_dir: str, options: dict) -> None:
    if options.get("slow_fsync_ms"):
        real_fsync, delay = os.fsync, options["slow_fsync_ms"] / 1000

        def slow_fsync(fd):
            time.sleep(delay)
            real_fsync(fd)

        os.fsync = slow_fsync
    crash = options.get("crash")
    if crash:
        install_crash(crash[0], int(crash[1]))
    graceful = GracefulStopCallback() if options.get("graceful") else None
    # Progress first: at step 3 it waits for the signal, then GracefulStopCallback.on_step_end
    # sees the request in the same step.
    callbacks = [ProgressCallback(output_dir, options.get("started_file"), graceful)]
    if graceful is not None:
        callbacks.append(graceful)
    if crash and crash[0] == "after_save":
        callbacks.append(_KillAfterSave(int(crash[1])))
    trainer = build_trainer(output_dir, options, callbacks)
    resume = True if ckpt.get_last_checkpoint(output_dir) is not None else None
    trainer.train(resume_from_checkpoint=resume)
    from safetensors.torch import save_file

    # Written atomically too: a kill after training must not leave a half file the test would read.
    os.makedirs(output_dir, exist_ok=True)
    temporary = os.path.join(output_dir, "final.safetensors.tmp")
    save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()}, temporary)
    os.replace(temporary, os.path.join(output_dir, "final.safetensors"))
    with open(os.path.join(output_dir, "result.json"), "w") as f:
        json.dump({"global_step": trainer.state.global_step, "resumed": bool(resume)}, f)


class _KillAfterSave(TrainerCallback):
    def __init__(self, nth: int):
        self.nth, self.count = nth, 0

    def on_save(self, args, state, control, **kwargs):
        self.count += 1
        if self.count == self.nth:
            _kill_myself()


def _child(output_dir: str, options: dict, log_path: str) -> None:
    """Runs in the forked child: never returns, never touches the server's stdin/stdout."""
    try:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        print(f"--- pid {os.getpid()} start {json.dumps(options)}", flush=True)
        train_job(output_dir, options)
        print(f"--- pid {os.getpid()} done", flush=True)
        code = 0
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve() -> None:
    torch.set_num_threads(1)  # no OpenMP pool before fork; one thread as in the test suite
    importlib.import_module("torch._dynamo")  # the first optimizer of a process imports it (~1 s): pay once here
    child, started = None, 0.0

    def reply(message: dict) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    def reap() -> dict:
        nonlocal child
        _pid, status = os.waitpid(child, 0)
        child = None
        return {"returncode": _returncode(status), "elapsed": time.monotonic() - started}

    reply({"ready": True})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "start":
            assert child is None, "one child at a time"
            sys.stdout.flush()
            started = time.monotonic()
            pid = os.fork()
            if pid == 0:
                _child(command["output_dir"], command.get("options", {}), command["log"])
            child = pid
            reply({"pid": pid})
        elif command["cmd"] == "signal":
            # An exited child stays a zombie until reaped below, so its pid cannot be reused yet.
            os.kill(child, command["signal"])
            reply(reap())
        elif command["cmd"] == "wait":
            reply(reap())
        elif command["cmd"] == "exit":
            break
    if child is not None:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve()
    else:
        sys.exit("usage: python crash_worker.py serve")
