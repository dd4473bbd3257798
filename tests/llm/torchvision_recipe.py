"""torchvision for the tests on a CPU torch (../shared/PEERS.md, "torchvision on a CPU torch"): PyPI's
torchvision 0.28.0 (the release for torch 2.13) installed without dependencies into a folder of the test cache
(~/.cache/lathe-test-assets, or $LATHE_TEST_ASSETS), and a `sitecustomize.py` beside it that puts a blank
module under sys.modules["torchvision._meta_registrations"] (the compiled-ops registration, which fails beside a
CPU torch, is skipped; the pure-PyTorch transforms transformers' processors use all work). A test runs its code
in a subprocess with PYTHONPATH=SHIM:DIR. This is a test device only: lathe ships no shim, and on a user's machine
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


def run_with_torchvision(code: str, timeout: int = 600, timm: bool = False) -> subprocess.CompletedProcess:
    """`code` run by this Python with torchvision importable (the recipe), and timm where asked, the repository first
    on sys.path."""
    shim, target = torchvision_paths()
    repository = Path(__file__).resolve().parents[2]
    paths = [str(shim), str(target), *([str(timm_path())] if timm else []), str(repository)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    env.setdefault("OMP_NUM_THREADS", "1")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result
