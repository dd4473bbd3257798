"""torchvision for the tests on a CPU torch (../shared/PEERS.md, "torchvision on a CPU torch"): PyPI's
torchvision 0.28.0 (the release for torch 2.13) installed without dependencies into a folder of the test cache
(~/.cache/lathe-test-assets, or $LATHE_TEST_ASSETS), and a `sitecustomize.py` beside it that puts a blank
module under sys.modules["torchvision._meta_registrations"] (the compiled-ops registration, which fails beside a
CPU torch, is skipped; the pure-PyTorch transforms transformers' processors use all work). A test runs its code
in another Python with PYTHONPATH=SHIM:DIR (run_with_torchvision: one such Python per test process, reused). This is a test device only: lathe ships no shim, and on a user's machine
torchvision imports as it is. A failed download skips the test with its reason. timm (Gemma 3n's vision tower),
which needs torchvision, is installed the same way into its own folder where a test asks for it (timm_path)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.llm.real_tokenizers import CACHE

VERSION = "0.28.0"
TIMM_VERSION = "1.0.31"
SITECUSTOMIZE = '''"""Test device only: torchvision's compiled ops do not load beside a CPU torch; skip their registration."""
import sys
import types

sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
'''


def _install(requirement: str, package: str, target: Path) -> None:
    """`pip install --no-deps --target` of requirement into target (published by one rename), unless there."""
    if (target / package / "__init__.py").is_file():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", work]
        result = subprocess.run([*command, requirement], capture_output=True, text=True)
        if result.returncode:
            pytest.skip(f"installing {requirement} failed: {result.stderr.strip()[-300:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:  # one rename; another test process (an xdist worker) may have published it first: keep that one
            os.rename(work, target)
            os.makedirs(work)  # TemporaryDirectory removes it again
        except OSError:
            pass


def timm_path() -> Path:
    """The folder timm is installed in (without its dependencies: torch, torchvision, huggingface_hub, safetensors
    and pyyaml are the venv's and the recipe's)."""
    target = CACHE / f"timm-{TIMM_VERSION}" / "site"
    _install(f"timm=={TIMM_VERSION}", "timm", target)
    return target


def torchvision_paths() -> tuple[Path, Path]:
    """(SHIM, DIR): the folder holding sitecustomize.py and the folder torchvision is installed in."""
    root = CACHE / f"torchvision-{VERSION}"
    shim, target = root / "shim", root / "site"
    _install(f"torchvision=={VERSION}", "torchvision", target)
    shim.mkdir(parents=True, exist_ok=True)
    staged = shim / f".sitecustomize.{os.getpid()}"  # written whole, then renamed: a concurrent reader never sees half
    staged.write_text(SITECUSTOMIZE)
    os.replace(staged, shim / "sitecustomize.py")
    return shim, target


# The recipe's process: it reads one JSON line per request ({"code"}), runs the code as a fresh __main__ (its prints
# and errors captured, the working folder and argv restored after), and answers on the control pipe (argv[1]).
SERVER = r"""
import contextlib, io, json, os, sys, traceback
control = os.fdopen(int(sys.argv[1]), "w")
for line in sys.stdin:
    code, out, err = 0, io.StringIO(), io.StringIO()
    cwd, argv = os.getcwd(), list(sys.argv)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(json.loads(line)["code"], "<recipe>", "exec"), {"__name__": "__main__"})
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:
        err.write(traceback.format_exc())
        code = 1
    finally:
        os.chdir(cwd)
        sys.argv[:] = argv
    control.write(json.dumps({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
    control.flush()
"""


class _Recipe:
    """One long-lived Python with the recipe on its path, per test process (an xdist worker) and timm setting: each
    recipe process pays ~8 CPU seconds of torch / transformers / torchvision imports, and six test modules use it."""

    def __init__(self, paths: list[str], log: Path):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        env.setdefault("OMP_NUM_THREADS", "1")
        read, write = os.pipe()
        self.log = log
        with open(log, "w") as sink:  # what the process's own descriptors get (a child process's output)
            self.process = subprocess.Popen(
                [sys.executable, "-u", "-c", SERVER, str(write)],
                stdin=subprocess.PIPE, stdout=sink, stderr=subprocess.STDOUT, env=env, text=True, pass_fds=(write,),
            )  # fmt: skip
        os.close(write)
        self.control = os.fdopen(read)

    def run(self, code: str, timeout: int) -> subprocess.CompletedProcess:
        import json
        import select

        self.process.stdin.write(json.dumps({"code": code}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.control], [], [], timeout)
        if not ready:
            self.process.kill()
            raise subprocess.TimeoutExpired("recipe", timeout)
        line = self.control.readline()
        if not line:  # the process died (a crash in C, a kill): its own output says why
            raise AssertionError(f"the recipe process ended: {self.log.read_text()[-3000:]}")
        answer = json.loads(line)
        return subprocess.CompletedProcess("recipe", answer["returncode"], answer["stdout"], answer["stderr"])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


_RECIPES: dict[bool, _Recipe] = {}


def run_with_torchvision(code: str, timeout: int = 600, timm: bool = False) -> subprocess.CompletedProcess:
    """`code` run with torchvision importable (the recipe), and timm where asked, the repository first on sys.path,
    by this test process's recipe Python (started on first use, reused by the next test modules: each code runs as a
    fresh __main__ there; module-level state of what it imports stays, as in one process)."""
    if timm not in _RECIPES or _RECIPES[timm].process.poll() is not None:
        import atexit

        shim, target = torchvision_paths()
        repository = Path(__file__).resolve().parents[2]
        paths = [str(shim), str(target), *([str(timm_path())] if timm else []), str(repository)]
        log = Path(tempfile.mkstemp(prefix="recipe-", suffix=".log")[1])
        _RECIPES[timm] = recipe = _Recipe(paths, log)
        atexit.register(recipe.close)
    result = _RECIPES[timm].run(code, timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result
