"""Runs the page starts: `lathe train CONFIG` in a subprocess (the CLI is the one source of truth), stopped
with SIGINT (lathe train finishes the step, saves a checkpoint and prints the resume line), resumed from the
last checkpoint; and the short CLI commands the page asks for (--dry_run plan, data preview, export)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from lathe.llm.webui.runs import JOB_LOG, checkpoints

OUTPUT_LIMIT = 200_000  # characters of a short command's output sent back to the page


def lathe_command(*args: str) -> list[str]:
    """This python's lathe (the one serving the page), never a name looked up on PATH."""
    return [sys.executable, "-m", "lathe", *args]


def child_environment(root: str | None = None) -> dict:
    env = dict(os.environ)
    if root is not None:  # the data rows' image / audio / video files stay under the root too (multimodal/media.py)
        env["LATHE_MEDIA_ROOT"] = os.path.realpath(root)
    env["PYTHONUNBUFFERED"] = "1"  # the log tail shows lines as they are printed
    env.pop("LATHE_WEBUI_KEY", None)  # the page's key is no business of the training process
    return env


class Jobs:
    """The `lathe train` processes this server started, by run (output_dir relative to the root)."""

    def __init__(self, root: str):
        self.root = root
        self._processes: dict[str, subprocess.Popen] = {}
        self._stopping: set[str] = set()
        self._lock = threading.Lock()

    def start(self, run: str, config_path: str, overrides: list[str] = ()) -> None:
        output_dir = os.path.join(self.root, run)
        with self._lock:
            if self.status(run) in ("running", "stopping"):
                raise ValueError(f"run {run} is already running; stop it first.")
            os.makedirs(output_dir, exist_ok=True)
            with open(os.path.join(output_dir, JOB_LOG), "ab") as log:
                log.write(f"$ lathe train {config_path} {' '.join(overrides)}\n".encode())
                log.flush()
                # A session of its own: Ctrl-C in the server's terminal does not reach the run (stop it here).
                self._processes[run] = subprocess.Popen(
                    lathe_command("train", config_path, *overrides),
                    cwd=self.root,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=child_environment(self.root),
                    start_new_session=True,
                )
            self._stopping.discard(run)

    def stop(self, run: str) -> None:
        """SIGINT, as Ctrl-C: the run stops after the current step with a checkpoint."""
        process = self._processes.get(run)
        if process is None or process.poll() is not None:
            raise ValueError(f"run {run} is not running here.")
        self._stopping.add(run)
        process.send_signal(signal.SIGINT)

    def resume(self, run: str, config_path: str) -> str:
        found = checkpoints(os.path.join(self.root, run))
        if not found:
            raise ValueError(f"run {run} has no checkpoint to resume from.")
        self.start(run, config_path, [f"resume_from_checkpoint={found[-1]}"])
        return found[-1]

    def status(self, run: str) -> str | None:
        """running, stopping, stopped (by SIGINT/SIGTERM), failed, done; None for runs not started here."""
        process = self._processes.get(run)
        if process is None:
            return None
        code = process.poll()
        if code is None:
            return "stopping" if run in self._stopping else "running"
        if code == 0:
            return "done"
        return "stopped" if code in (130, 143, -2, -15) else "failed"

    def wait(self, run: str, timeout: float | None = None) -> int | None:
        process = self._processes.get(run)
        return None if process is None else process.wait(timeout)

    def running(self) -> list[str]:
        return [run for run in self._processes if self.status(run) == "running"]


def run_short(args: list[str], root: str, timeout: float) -> dict:
    """A short lathe command (plan, preview, export): its exit code and output, bounded in time and size."""
    try:
        done = subprocess.run(
            lathe_command(*args),
            cwd=root,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=child_environment(root),
        )
    except subprocess.TimeoutExpired:
        return {"code": None, "output": f"lathe {args[0]} took longer than {timeout:.0f} s and was stopped."}
    output = (done.stdout + ("\n" if done.stdout and done.stderr else "") + done.stderr)[-OUTPUT_LIMIT:]
    return {"code": done.returncode, "output": output}
