"""What the README says is what the repository does: its test command is the one CI runs, its extras are
pyproject's, its quickstart numbers are what the quickstart prints (docs/readme_numbers.py writes them), and
no tracked file holds an unresolved merge conflict."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# Built, not written out, so this file does not hold the markers it looks for.
CONFLICT = re.compile(r"^(?:" + "|".join(re.escape(c * 7) for c in "<>|") + r")(?: |$)", re.MULTILINE)
RECORDED_MLP_OUTPUT = """***** eval metrics *****
  epoch                   =        8.0
  eval_r2                 =     0.9391

held-out R^2: -0.032 before training -> 0.939 after (1024 steps, 4.0 s)
"""


def load_readme_numbers():
    spec = importlib.util.spec_from_file_location("readme_numbers", ROOT / "docs" / "readme_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tracked_files():
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout ({error}): the tracked files are unknown")
    return [ROOT / name for name in listed.stdout.decode().split("\0") if name]


def test_no_conflict_markers():
    assert not CONFLICT.search(README), "README.md holds merge-conflict markers"
    conflicted = []
    for path in tracked_files():
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data:  # a binary file
            continue
        text = data.decode("utf-8", errors="replace")
        conflicted += [
            f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}" for m in CONFLICT.finditer(text)
        ]
    assert not conflicted, f"merge-conflict markers in: {', '.join(conflicted)}"


def test_the_conflict_check_finds_git_markers():
    sample = "a\n" + "<" * 7 + " HEAD\nb\n" + "=" * 7 + "\nc\n" + ">" * 7 + " main\n"
    assert len(CONFLICT.findall(sample)) == 2
    assert not CONFLICT.search("x <<<<<<< y\n" + "=" * 7 + "\n")  # only at a line's start


def test_ci_runs_exactly_the_readmes_test_command():
    section = README.split("## Tests", 1)[1]
    command = re.search(r"```bash\n(.+?)\n```", section, re.DOTALL)[1].strip()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == command  # the last line, whose status is the script's
    assert "python3 -m venv" in (ROOT / ".ci" / "run").read_text()


def test_readme_names_every_extra():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    paragraph = README.split("Extras: ", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`lathe\[([\w-]+)\]`", paragraph))
    assert named == set(extras)


def test_readme_numbers_regions_are_rewritten_alone():
    numbers = load_readme_numbers()
    measured = numbers.render_mlp(numbers.parse_mlp_output(RECORDED_MLP_OUTPUT), wall_s=8.4)
    assert measured == (
        "held-out R² -0.032 before training → 0.939 after, 1,024 steps in 4.0 s of training "
        "(8 s including Python start-up)"
    )
    rewritten = numbers.replace_region(README, "quickstart-mlp", measured)
    assert numbers.regions(rewritten)["quickstart-mlp"] == measured
    old = numbers.regions(README)["quickstart-mlp"]
    assert rewritten.replace(measured, old) == README  # nothing else changed
    with pytest.raises(SystemExit, match="no <!-- numbers:missing -->"):
        numbers.replace_region(README, "missing", measured)
    kept = numbers.keep_timings("quickstart-mlp", old, measured)
    assert numbers.stable_mlp(kept) == numbers.stable_mlp(measured)
    assert numbers.TIMINGS["quickstart-mlp"].search(kept)[0] == " ".join(
        numbers.TIMINGS["quickstart-mlp"].search(old)[0].split()
    )


def test_readme_llm_numbers_read_back():
    numbers = load_readme_numbers()
    llm = numbers.stable_llm(numbers.regions(README)["quickstart-llm"])
    assert llm["total"] == 500  # the held-out strings of examples/quickstart/data
    assert 100 * llm["right"] / llm["total"] == pytest.approx(llm["exact"], abs=0.05)
    assert llm["steps"] == 314  # 10,000 examples, batch 64, 2 epochs
    rendered = numbers.render_llm({**llm, "wall_s": 61.2, "train_s": 44.9})
    assert numbers.stable_llm(rendered) == llm and "61 s wall" in rendered and "45 s of training" in rendered


@pytest.mark.slow
def test_readme_numbers_are_what_the_mlp_quickstart_prints(tmp_path):
    numbers = load_readme_numbers()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = numbers.stable_mlp(numbers.render_mlp(numbers.parse_mlp_output(done.stdout), wall_s=0))
    written = numbers.stable_mlp(numbers.regions(README)["quickstart-mlp"])
    regenerate = "rerun python docs/readme_numbers.py"
    assert printed["steps"] == written["steps"], regenerate
    # A few thousandths for another CPU's float rounding; a changed example or Trainer moves them more.
    assert float(printed["before"]) == pytest.approx(float(written["before"]), abs=0.003), regenerate
    assert float(printed["after"]) == pytest.approx(float(written["after"]), abs=0.003), regenerate
