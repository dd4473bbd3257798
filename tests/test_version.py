"""`lathe --version` and `lathe version` print the installed lathe's version, as LLaMA-Factory's `version`
command does, without importing torch; lathe.__version__ is pyproject.toml's version."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lathe
from lathe import cli

ROOT = Path(__file__).resolve().parent.parent


def installed_version():
    try:
        return importlib.metadata.version("lathe")
    except importlib.metadata.PackageNotFoundError:
        return lathe.__version__


@pytest.mark.parametrize("argv", [["--version"], ["version"]])
def test_version_prints_the_installed_version_without_importing_torch(argv):
    # A fresh interpreter, as a user's shell starts one: torch must not be imported to answer.
    probe = f"import sys; from lathe.cli import main; code = main({argv!r}); print('torch' in sys.modules, code)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"lathe {installed_version()}", "False 0"]


def test_the_command_line_entry_point_answers(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"lathe {installed_version()}\n"
    with pytest.raises(SystemExit):  # the sub-command takes no arguments
        cli.main(["version", "extra"])


def test_version_falls_back_to_the_module_when_lathe_is_not_installed(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setattr(lathe, "__version__", "9.8.7")
    assert cli.lathe_version() == "9.8.7"


def test_module_version_is_the_package_version():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert lathe.__version__ == project["version"]
