"""Crash safety of checkpoints: real SIGKILLs at random moments and inside saves, corrupt and
incomplete folders, a full disk, an unwritable output_dir, a moved output folder, a graceful
SIGTERM, and rotation that never deletes before the new checkpoint is committed.

The killed processes come from crash_worker.py's fork server (see its docstring for why)."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lathe.train.checkpoints import layout as ckpt
from tests.train import crash_worker

REPOSITORY = Path(__file__).resolve().parents[2]
WORKER = Path(crash_worker.__file__)
STEPS = 24  # crash_worker's job: 48 samples, batch 4, 2 epochs


# ----- the fork server -----


class CrashServer:
    """Talks to `crash_worker.py serve`; every reply has a deadline, so a hung child fails the
    test instead of hanging it."""

    def __init__(self, log_dir: Path):
        env = {**os.environ, "PYTHONPATH": str(REPOSITORY), "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
            cwd=str(REPOSITORY),
        )
        self.log_dir = log_dir
        self.runs = 0
        self.log = None
        assert self._reply(timeout=180) == {"ready": True}

    def _reply(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise TimeoutError(f"crash_worker did not answer within {timeout} s; last log: {self.log_tail()}")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"crash_worker exited (code {self.process.poll()}); last log: {self.log_tail()}")
        return json.loads(line)

    def _send(self, timeout: float, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._reply(timeout)

    def start(self, output_dir: Path, options: dict | None = None) -> None:
        self.runs += 1
        self.log = self.log_dir / f"run-{self.runs}.log"
        self._send(30, cmd="start", output_dir=str(output_dir), options=options or {}, log=str(self.log))

    def wait(self, timeout: float = 120) -> dict:
        return self._send(timeout, cmd="wait")

    def signal(self, signum: int, timeout: float = 120) -> dict:
        return self._send(timeout, cmd="signal", signal=int(signum))

    def run(self, output_dir: Path, options: dict | None = None) -> dict:
        self.start(output_dir, options)
        return self.wait()

    def log_tail(self, characters: int = 3000) -> str:
        return self.log.read_text()[-characters:] if self.log is not None and self.log.exists() else "(no log)"

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def crash_server(tmp_path_factory):
    server = CrashServer(tmp_path_factory.mktemp("crash-logs"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def reference_weights(crash_server, tmp_path_factory):
    """Final weights and duration of an uninterrupted run of the worker's job (saves included)."""
    output_dir = tmp_path_factory.mktemp("reference") / "output"
    result = crash_server.run(output_dir)
    assert result["returncode"] == 0, crash_server.log_tail()
    return load_file(str(output_dir / "final.safetensors")), result["elapsed"]


def assert_same_weights(actual: dict, expected: dict, context: str = "") -> None:
    assert actual.keys() == expected.keys()
    different = [name for name in expected if not torch.equal(actual[name], expected[name])]
    assert not different, f"weights differ from the uninterrupted run in {different} {context}"


def step_of(path: str) -> int:
    return int(os.path.basename(path).rsplit("-", 1)[1])


def assert_checkpoints_consistent(output_dir: Path, context: str) -> str | None:
    """What must hold after any kill: every checkpoint-N folder complete, get_last_checkpoint
    complete (or None), and no committed save lost (on_save ran => that step or a newer one)."""
    folders = ckpt.sorted_checkpoints(str(output_dir))
    incomplete = [path for path in folders if not ckpt.is_complete_checkpoint(path)]
    assert not incomplete, f"incomplete checkpoint folders after {context}: {incomplete}"
    last = ckpt.get_last_checkpoint(str(output_dir))
    assert last is None or ckpt.is_complete_checkpoint(last)
    saved_log = output_dir / "saved_steps.txt"
    if saved_log.exists():
        committed = [int(line) for line in saved_log.read_text().split()]
        if committed:
            assert last is not None and step_of(last) >= max(committed), (
                f"after {context}: step {max(committed)} was saved, but the newest complete checkpoint is {last}"
            )
    return last


def has_staging_folder(output_dir: Path) -> bool:
    return output_dir.is_dir() and any(name.startswith(ckpt.STAGING_PREFIX) for name in os.listdir(output_dir))


# ----- SIGKILL, for real -----

# Exact moments inside a save that random kills rarely hit: (phase, at the n-th time reached).
PHASE_KILLS = [
    ("mid_write", 3),
    ("before_manifest", 2),
    ("before_rename", 4),
    ("before_rotation", 5),
    ("mid_rotation", 3),
    ("after_save", 2),
]
RANDOM_KILLS = 20


@pytest.mark.slow
def test_sigkill_anywhere_keeps_checkpoints_complete_and_resume_exact(crash_server, reference_weights, tmp_path):
    reference, duration = reference_weights
    episode = 0
    output_dir = tmp_path / f"episode-{episode}"

    def finish_episode(output_dir: Path) -> None:
        """Resume until the run completes, then compare with the uninterrupted run."""
        result = crash_server.run(output_dir)
        assert result["returncode"] == 0, crash_server.log_tail()
        result_file = json.loads((output_dir / "result.json").read_text())
        assert result_file["global_step"] == STEPS
        assert_same_weights(load_file(str(output_dir / "final.safetensors")), reference, f"in {output_dir}")

    # 1. Every named moment of a save, one after another in one run that keeps resuming.
    for phase, nth in PHASE_KILLS:
        result = crash_server.run(output_dir, {"crash": [phase, nth]})
        assert result["returncode"] == -signal.SIGKILL, f"{phase}: {crash_server.log_tail()}"
        assert_checkpoints_consistent(output_dir, f"a kill at {phase}")
    finish_episode(output_dir)

    # 2. Random moments: delays spread over the measured length of what is left of the run (saves
    # are most of it), so kills land in steps, in saves and in rotation. A run that finishes
    # before its kill ends an episode (compared with the reference); the next one starts from
    # scratch. Counting only kills that landed keeps the test meaningful on a slow or a fast
    # machine.
    rng = random.Random(20261121)
    landed, during_save, finished = 0, 0, 0
    episode += 1
    output_dir = tmp_path / f"episode-{episode}"
    deadline = time.monotonic() + 240
    while landed < RANDOM_KILLS:
        assert time.monotonic() < deadline, f"only {landed} kills landed before the deadline"
        last = ckpt.get_last_checkpoint(str(output_dir))
        left = 1.0 - (step_of(last) / STEPS if last else 0.0)
        crash_server.start(output_dir)
        time.sleep(rng.uniform(0.0, duration * max(left, 0.2)))
        result = crash_server.signal(signal.SIGKILL)
        if result["returncode"] == 0:  # finished before the kill
            finished += 1
            finish_episode(output_dir)
            episode += 1
            output_dir = tmp_path / f"episode-{episode}"
            continue
        assert result["returncode"] == -signal.SIGKILL, crash_server.log_tail()
        landed += 1
        during_save += has_staging_folder(output_dir)
        assert_checkpoints_consistent(output_dir, f"random kill {landed}")
    finish_episode(output_dir)
    # A staging folder left behind proves the kill landed inside a save (before its rename).
    assert during_save >= 1, f"none of {landed} random kills landed inside a save"
    print(
        f"{landed} random kills ({during_save} inside a save), {finished} runs finished early, "
        f"{len(PHASE_KILLS)} kills at named save phases; uninterrupted run {duration:.2f} s"
    )


# ----- graceful stop -----


@pytest.mark.slow
def test_sigterm_with_graceful_stop_saves_exits_zero_and_resumes_exactly(crash_server, tmp_path):
    reference_dir = tmp_path / "reference"
    assert crash_server.run(reference_dir, {"graceful": True})["returncode"] == 0, crash_server.log_tail()
    reference = load_file(str(reference_dir / "final.safetensors"))

    output_dir, started = tmp_path / "output", tmp_path / "started"
    crash_server.start(output_dir, {"graceful": True, "started_file": str(started)})
    deadline = time.monotonic() + 120
    while not started.exists():
        assert time.monotonic() < deadline, crash_server.log_tail()
        time.sleep(0.02)
    result = crash_server.signal(signal.SIGTERM)
    assert result["returncode"] == 0, crash_server.log_tail()
    stopped_at = json.loads((output_dir / "result.json").read_text())["global_step"]
    assert stopped_at == 3  # the step that was running when the signal came, then no more
    assert [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(output_dir))] == ["checkpoint-3"]
    assert ckpt.is_complete_checkpoint(str(output_dir / "checkpoint-3"))
    assert ckpt.get_last_checkpoint(str(output_dir)) == str(output_dir / "checkpoint-3")

    result = crash_server.run(output_dir, {"graceful": True})
    assert result["returncode"] == 0, crash_server.log_tail()
    assert json.loads((output_dir / "result.json").read_text()) == {"global_step": STEPS, "resumed": True}
    assert_same_weights(load_file(str(output_dir / "final.safetensors")), reference)


# ----- in-process cases built by hand -----

MAX_STEPS = 8


def trainer_for(output_dir: Path, trainer_kwargs: dict | None = None, **arguments):
    """crash_worker's job, cut to MAX_STEPS steps, a checkpoint every 2 steps, no rotation."""
    options = {"max_steps": MAX_STEPS, "save_steps": 2, "save_total_limit": None}
    options.update(arguments)
    return crash_worker.build_trainer(str(output_dir), {"args": options}, **(trainer_kwargs or {}))


class StopAt(crash_worker.TrainerCallback):
    """Ends training after `step` (its checkpoint saved), as an interrupted run would have."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


def train_until(output_dir: Path, step: int, **arguments):
    trainer = trainer_for(output_dir, **arguments)
    trainer.add_callback(StopAt(step))
    trainer.train()
    return trainer


def weights_of(model) -> dict:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.fixture(scope="module")
def short_reference(tmp_path_factory):
    trainer = trainer_for(tmp_path_factory.mktemp("short-reference") / "output", save_strategy="no")
    trainer.train()
    return weights_of(trainer.model)


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def remove_trainer_state(folder: Path) -> None:
    (folder / ckpt.TRAINER_STATE_NAME).unlink()


def truncate_weights(folder: Path) -> None:
    truncate(folder / ckpt.WEIGHTS_NAME)


def change_a_manifest_size(folder: Path) -> None:
    manifest = json.loads((folder / ckpt.MANIFEST_NAME).read_text())
    manifest["files"][ckpt.OPTIMIZER_NAME] += 1
    (folder / ckpt.MANIFEST_NAME).write_text(json.dumps(manifest))


def break_the_manifest(folder: Path) -> None:
    (folder / ckpt.MANIFEST_NAME).write_text('{"format": 1, "files": {')


def empty_folder(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.mkdir()


@pytest.mark.parametrize(
    "damage", [remove_trainer_state, truncate_weights, change_a_manifest_size, break_the_manifest, empty_folder]
)
def test_newest_broken_checkpoint_is_skipped_with_a_warning_and_resume_falls_back(
    damage, tmp_path, short_reference, caplog
):
    output_dir = tmp_path / "output"
    train_until(output_dir, 6)  # checkpoints 2, 4, 6
    damage(output_dir / "checkpoint-6")
    with caplog.at_level(logging.WARNING, logger="lathe.train.checkpoints.layout"):
        assert ckpt.get_last_checkpoint(str(output_dir)) == str(output_dir / "checkpoint-4")
    assert any("checkpoint-6" in record.getMessage() for record in caplog.records)

    trainer = trainer_for(output_dir)
    trainer.train(resume_from_checkpoint=True)  # resumes at 4, rewrites 6, goes on to 8
    assert_same_weights(weights_of(trainer.model), short_reference)
    assert all(ckpt.is_complete_checkpoint(path) for path in ckpt.sorted_checkpoints(str(output_dir)))


def test_explicit_resume_from_a_broken_checkpoint_is_a_clear_error(tmp_path):
    output_dir = tmp_path / "output"
    train_until(output_dir, 4)
    truncate_weights(output_dir / "checkpoint-4")
    with pytest.raises(ValueError, match="incomplete or corrupt"):
        trainer_for(output_dir).train(resume_from_checkpoint=str(output_dir / "checkpoint-4"))


def test_staging_leftovers_are_ignored_and_removed_by_the_next_save(tmp_path, short_reference):
    output_dir = tmp_path / "output"
    train_until(output_dir, 4)  # checkpoints 2, 4
    # A crash before the rename leaves a staging folder; even one that looks complete (manifest
    # and all) is not a checkpoint until renamed.
    shutil.copytree(output_dir / "checkpoint-4", output_dir / ".staging-checkpoint-6")
    # ... and leftovers of steps this run never saves (odd steps: another save_steps) or of a
    # rotation killed mid-delete.
    for name in (".staging-checkpoint-7", ".staging-deleting-checkpoint-1"):
        (output_dir / name).mkdir()
        (output_dir / name / ckpt.OPTIMIZER_NAME).write_bytes(b"half")
    assert ckpt.get_last_checkpoint(str(output_dir)) == str(output_dir / "checkpoint-4")
    assert [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(output_dir))] == ["checkpoint-2", "checkpoint-4"]

    # An explicit path skips get_last_checkpoint's clean-up: the saves themselves must tidy up.
    trainer = trainer_for(output_dir)
    trainer.train(resume_from_checkpoint=str(output_dir / "checkpoint-4"))
    assert_same_weights(weights_of(trainer.model), short_reference)
    leftovers = sorted(name for name in os.listdir(output_dir) if name.startswith(ckpt.STAGING_PREFIX))
    assert leftovers == []
    assert [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(output_dir))] == [
        f"checkpoint-{n}" for n in (2, 4, 6, 8)
    ]


# ----- full disk, unwritable output_dir -----

# torch.save does not raise OSError when a write fails: its zip writer notices the short write
# afterwards (seen here with a file-size limit; a full disk takes the same path).
TORCH_WRITE_FAILURE = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def failing_inside(real, error: BaseException, marker: str = ".staging-checkpoint-4"):
    """`real`, raising `error` instead when a path argument is inside the given staging folder."""

    def wrapper(*args, **kwargs):
        if any(marker in os.fspath(a) for a in (*args, *kwargs.values()) if isinstance(a, (str, os.PathLike))):
            raise error
        return real(*args, **kwargs)

    return wrapper


def assert_only_committed_checkpoints(output_dir: Path, steps: list[int]) -> None:
    names = sorted(os.listdir(output_dir))
    assert [n for n in names if n.startswith(ckpt.STAGING_PREFIX)] == [], names
    assert [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(output_dir))] == [f"checkpoint-{s}" for s in steps]
    assert all(ckpt.is_complete_checkpoint(str(output_dir / f"checkpoint-{s}")) for s in steps)


@pytest.mark.parametrize("failure", ["ENOSPC from safetensors", "torch.save write failure"])
def test_full_disk_during_a_save_is_a_clear_error_and_the_previous_checkpoint_resumes(
    failure, tmp_path, monkeypatch, short_reference
):
    import safetensors.torch

    if failure == "ENOSPC from safetensors":
        error = OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(safetensors.torch, "save_model", failing_inside(safetensors.torch.save_model, error))
    else:
        monkeypatch.setattr(torch, "save", failing_inside(torch.save, RuntimeError(TORCH_WRITE_FAILURE)))
    output_dir = tmp_path / "output"
    with pytest.raises((OSError, RuntimeError)) as raised:
        trainer_for(output_dir).train()  # the 2nd save is checkpoint-4
    message = "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
    assert "disk space" in message and str(output_dir / "checkpoint-4") in message, message
    if isinstance(raised.value, OSError):
        assert raised.value.errno == errno.ENOSPC  # code that handles a full disk can still tell
    assert_only_committed_checkpoints(output_dir, [2])

    monkeypatch.undo()
    trainer = trainer_for(output_dir)
    trainer.train(resume_from_checkpoint=True)
    assert_same_weights(weights_of(trainer.model), short_reference)


def test_every_file_and_folder_is_flushed_before_the_rename(tmp_path, monkeypatch):
    flushed_files, flushed_folders = [], []
    monkeypatch.setattr(ckpt, "_fsync_file", flushed_files.append)
    monkeypatch.setattr(ckpt, "_fsync_dir", flushed_folders.append)
    final = tmp_path / "checkpoint-1"
    with ckpt.atomic_checkpoint(str(final)) as staging:
        for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
            Path(staging, name).write_bytes(b"x" * 10)
        os.makedirs(os.path.join(staging, "adapter"))
        Path(staging, "adapter", "adapter_model.safetensors").write_bytes(b"y")
        staging_folder = staging
    names = {
        "model.safetensors",
        "optimizer.pt",
        "trainer_state.json",
        ckpt.MANIFEST_NAME,
        "adapter/adapter_model.safetensors",
    }
    assert sorted(os.path.relpath(path, staging_folder) for path in flushed_files) == sorted(names)
    # Each folder after its files (the subfolder before the checkpoint folder), then output_dir after the rename.
    assert flushed_folders == [os.path.join(staging_folder, "adapter"), staging_folder, str(tmp_path)]
    assert sorted(os.listdir(final)) == sorted(
        {"adapter", "model.safetensors", "optimizer.pt", "trainer_state.json", ckpt.MANIFEST_NAME}
    )


def test_a_failed_flush_is_a_clear_error_and_publishes_nothing(tmp_path, monkeypatch, short_reference):
    real_fsync = os.fsync
    saves = []

    def fsync(fd):  # the 2nd checkpoint's weights cannot be flushed (I/O error), in a flushing thread
        if os.readlink(f"/proc/self/fd/{fd}").endswith("model.safetensors"):
            saves.append(fd)
            if len(saves) == 2:
                raise OSError(errno.EIO, "Input/output error")
        return real_fsync(fd)

    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to tell which file is flushed")
    monkeypatch.setattr(os, "fsync", fsync)
    output_dir = tmp_path / "output"
    with pytest.raises(OSError) as raised:
        trainer_for(output_dir).train()
    assert raised.value.errno == errno.EIO and "earlier checkpoints are intact" in str(raised.value)
    assert_only_committed_checkpoints(output_dir, [2])
    monkeypatch.undo()
    trainer = trainer_for(output_dir)
    trainer.train(resume_from_checkpoint=True)
    assert_same_weights(weights_of(trainer.model), short_reference)


def test_output_dir_under_a_regular_file_is_a_clear_error(tmp_path):
    # Tests run as root, so permissions would not stop the writes; a file in the path does.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file")
    with pytest.raises(OSError, match="output_dir is writable") as raised:
        trainer_for(blocker / "output").train()
    assert str(blocker) in str(raised.value)


def test_unwritable_output_dir_is_a_clear_error_and_keeps_earlier_checkpoints(tmp_path, monkeypatch):
    output_dir = tmp_path / "output"
    real_makedirs = os.makedirs

    def makedirs(path, *args, **kwargs):
        if os.path.basename(os.fspath(path)) == ".staging-checkpoint-4":
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", makedirs)
    with pytest.raises(OSError, match="writable") as raised:
        trainer_for(output_dir).train()
    assert str(output_dir) in str(raised.value)
    assert_only_committed_checkpoints(output_dir, [2])


# ----- rotation -----


@pytest.mark.parametrize("where", ["while writing", "while publishing"])
def test_rotation_never_deletes_before_the_new_checkpoint_is_committed(where, tmp_path, monkeypatch, short_reference):
    output_dir = tmp_path / "output"

    def crashes_at_checkpoint_3(real):
        def wrapper(target, *args, **kwargs):
            path = args[0] if where == "while writing" else target
            if isinstance(path, (str, os.PathLike)) and ".staging-checkpoint-3" in os.fspath(path):
                raise RuntimeError("simulated crash inside the save of checkpoint-3")
            return real(target, *args, **kwargs)

        return wrapper

    if where == "while writing":  # torch.save(obj, path): the path is the 2nd argument
        monkeypatch.setattr(torch, "save", crashes_at_checkpoint_3(torch.save))
    else:  # everything written and flushed, the rename not yet done
        monkeypatch.setattr(ckpt, "_fsync_tree", crashes_at_checkpoint_3(ckpt._fsync_tree))
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer_for(output_dir, save_steps=1, save_total_limit=1).train()
    assert_only_committed_checkpoints(output_dir, [2])

    monkeypatch.undo()
    trainer = trainer_for(output_dir, save_steps=1, save_total_limit=1)
    trainer.train(resume_from_checkpoint=True)
    assert_same_weights(weights_of(trainer.model), short_reference)
    assert_only_committed_checkpoints(output_dir, [MAX_STEPS])


# ----- checkpoints written by transformers (no manifest) -----


def transformers_checkpoints(output_dir: Path, stop_at: int = 4) -> None:
    """checkpoint-2 and checkpoint-4 of the same job, written by transformers.Trainer."""
    import transformers

    class Stop(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= stop_at:
                control.should_training_stop = True

    arguments = transformers.TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        max_steps=MAX_STEPS,
        learning_rate=0.01,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        seed=7,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        use_cpu=True,
    )
    torch.manual_seed(0)
    trainer = transformers.Trainer(
        model=crash_worker.Regressor(), args=arguments, train_dataset=crash_worker.dataset(), callbacks=[Stop()]
    )
    trainer.train()


@pytest.mark.hf
def test_complete_transformers_checkpoints_without_a_manifest_are_accepted(tmp_path):
    output_dir = tmp_path / "output"
    transformers_checkpoints(output_dir)
    assert not (output_dir / "checkpoint-4" / ckpt.MANIFEST_NAME).exists()
    assert ckpt.get_last_checkpoint(str(output_dir)) == str(output_dir / "checkpoint-4")
    trainer = trainer_for(output_dir)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == MAX_STEPS


@pytest.mark.hf
@pytest.mark.parametrize("damage", [remove_trainer_state, truncate_weights, empty_folder])
def test_broken_transformers_checkpoints_are_skipped(damage, tmp_path, caplog):
    """What a transformers process killed mid-save leaves behind (its saves are not atomic)."""
    output_dir = tmp_path / "output"
    transformers_checkpoints(output_dir)
    damage(output_dir / "checkpoint-4")
    with caplog.at_level(logging.WARNING, logger="lathe.train.checkpoints.layout"):
        assert ckpt.get_last_checkpoint(str(output_dir)) == str(output_dir / "checkpoint-2")
    assert any("checkpoint-4" in record.getMessage() for record in caplog.records)
    trainer = trainer_for(output_dir)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == MAX_STEPS
    assert all(ckpt.is_complete_checkpoint(path) for path in ckpt.sorted_checkpoints(str(output_dir)))


# ----- a moved output folder -----


class CrashAfterSave(crash_worker.TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt("simulated crash after the save of step %d" % self.step)


def test_moved_output_folder_still_finds_and_loads_its_best_model(tmp_path):
    # Scores scripted per step: the best is step 4, saved before the folder moves.
    scores = {2: 1.0, 4: 5.0, 6: 2.0, 8: 3.0}
    holder = {}

    def trainer_in(output_dir: Path, callbacks=()):
        trainer = trainer_for(
            output_dir,
            eval_strategy="steps",
            eval_steps=2,
            save_total_limit=1,
            load_best_model_at_end=True,
            metric_for_best_model="score",
            greater_is_better=True,
            trainer_kwargs={
                "eval_dataset": crash_worker.dataset(8),
                "compute_metrics": lambda prediction: {"score": scores[holder["trainer"].state.global_step]},
            },
        )
        for callback in callbacks:
            trainer.add_callback(callback)
        holder["trainer"] = trainer
        return trainer

    first = tmp_path / "first"
    with pytest.raises(KeyboardInterrupt):
        trainer_in(first, [CrashAfterSave(6)]).train()
    # save_total_limit=1 with a distinct best keeps two: the best and the newest.
    assert [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(first))] == ["checkpoint-4", "checkpoint-6"]
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(str(first), str(moved))
    best_weights = load_file(str(moved / "checkpoint-4" / ckpt.WEIGHTS_NAME))

    trainer = trainer_in(moved)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.best_global_step == 4
    assert os.path.samefile(trainer._best_checkpoint_path(), moved / "checkpoint-4")
    assert_same_weights(weights_of(trainer.model), best_weights)
    assert [os.path.basename(p) for p in ckpt.sorted_checkpoints(str(moved))] == ["checkpoint-4"]
