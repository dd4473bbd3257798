"""Regenerate the README's quickstart numbers from real runs, so they are measured, not typed.

    python docs/readme_numbers.py          # runs examples/quickstart.py (~10 s) and rewrites its numbers
    python docs/readme_numbers.py --llm    # also `lathe train examples/quickstart.yaml` (~1 min) and the
                                           # untrained model's score (~20 s)
    python docs/readme_numbers.py --check  # runs, compares the numbers that repeat run to run (scores,
                                           # steps; not timings) with the README's, writes nothing
    python docs/readme_numbers.py --keep-timings  # rewrites the scores, keeps the README's timings (for a
                                                  # busy machine, whose timings say nothing)
    python docs/readme_numbers.py --busy   # only the LLM quickstart's timing on this machine as it is now,
                                           # with the load average around it: the README's "busy machine"
                                           # numbers (the quiet ones stay)

Each number lives in README.md between `<!-- numbers:NAME -->` and `<!-- /numbers -->`; only that text changes.
Timings are from the machine that runs the script (the README says it is 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REGION = re.compile(r"(<!-- numbers:(?P<name>[\w-]+) -->)(?P<text>.*?)(<!-- /numbers -->)", re.DOTALL)
MLP_LINE = re.compile(
    r"held-out R\^2: (?P<before>-?\d+\.\d+) before training -> (?P<after>-?\d+\.\d+) after "
    r"\((?P<steps>\d+) steps, (?P<train_s>\d+\.\d+) s\)"
)
MLP_TEXT = re.compile(
    r"R² (?P<before>-?\d+\.\d+) before training → (?P<after>-?\d+\.\d+) after, (?P<steps>[\d,]+) steps"
)
# The timings in each region's text, from "in" to the closing parenthesis.
TIMINGS = {
    "quickstart-mlp": re.compile(r"in\s+[\d.]+\s+s of training \(\d+ s including Python start-up\)"),
    "quickstart-llm": re.compile(r"in\s+[\d–-]+\s+s wall including start-up \([\d–-]+ s of training"),
}
LLM_TEXT = re.compile(
    r"\*\*(?P<exact>\d+\.\d)%\*\* \((?P<right>\d+)/(?P<total>\d+); the untrained model scores "
    r"(?P<untrained>\d+\.\d)%\).*?(?P<steps>\d+) steps\)",
    re.DOTALL,
)


def regions(text: str) -> dict[str, str]:
    """The README's marked numbers: name -> the text between the markers."""
    return {match["name"]: match["text"] for match in REGION.finditer(text)}


def replace_region(text: str, name: str, new: str) -> str:
    """`text` with region `name`'s content replaced by `new`; an error if the README lacks the markers."""
    if name not in regions(text):
        raise SystemExit(f"README.md has no <!-- numbers:{name} --> ... <!-- /numbers --> region")
    return REGION.sub(lambda m: m.group(1) + new + m.group(4) if m["name"] == name else m.group(0), text)


def keep_timings(name: str, old: str, new: str) -> str:
    """`new` with the timings of `old` (the README's text of region `name`)."""
    kept = TIMINGS[name].search(old)
    if kept is None:
        raise SystemExit(f"cannot find the timings in the README's {name} numbers: {old!r}")
    return TIMINGS[name].sub(lambda _: " ".join(kept.group(0).split()), new)


def parse_mlp_output(output: str) -> dict:
    """The numbers examples/quickstart.py prints on its last line."""
    match = MLP_LINE.search(output)
    if match is None:
        raise SystemExit("examples/quickstart.py did not print its 'held-out R^2: ...' line:\n" + output[-2000:])
    return {
        "before": match["before"],
        "after": match["after"],
        "steps": int(match["steps"]),
        "train_s": match["train_s"],
    }


def render_mlp(numbers: dict, wall_s: float) -> str:
    return (
        f"held-out R² {numbers['before']} before training → {numbers['after']} after, {numbers['steps']:,} steps in "
        f"{numbers['train_s']} s of training ({wall_s:.0f} s including Python start-up)"
    )


def stable_mlp(text: str) -> dict:
    """What repeats run to run in the README's (or a rendered) MLP text: both scores and the step count."""
    match = MLP_TEXT.search(text)
    if match is None:
        raise SystemExit(f"cannot read the MLP quickstart's numbers from: {text!r}")
    return {"before": match["before"], "after": match["after"], "steps": int(match["steps"].replace(",", ""))}


def render_llm(numbers: dict) -> str:
    return (
        f"**{numbers['exact']:.1f}%** ({numbers['right']}/{numbers['total']}; the untrained model scores "
        f"{numbers['untrained']:.1f}%) in {numbers['wall_s']:.0f} s wall including start-up "
        f"({numbers['train_s']:.0f} s of training, {numbers['steps']} steps)"
    )


def stable_llm(text: str) -> dict:
    match = LLM_TEXT.search(text)
    if match is None:
        raise SystemExit(f"cannot read the LLM quickstart's numbers from: {text!r}")
    return {
        "exact": float(match["exact"]),
        "right": int(match["right"]),
        "total": int(match["total"]),
        "untrained": float(match["untrained"]),
        "steps": int(match["steps"]),
    }


def _run(command: list[str], cwd: Path) -> tuple[str, float]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout, wall


def measure_mlp() -> str:
    with tempfile.TemporaryDirectory() as work:  # the example writes output/quickstart where it runs
        output, wall = _run([sys.executable, str(ROOT / "examples" / "quickstart.py")], cwd=Path(work))
    return render_mlp(parse_mlp_output(output), wall)


def _lathe_train(output_dir: Path, *overrides: str) -> tuple[dict, float]:
    command = [sys.executable, "-m", "lathe", "train", "examples/quickstart.yaml", f"output_dir={output_dir}"]
    _, wall = _run([*command, "disable_tqdm=true", *overrides], cwd=ROOT)
    return json.loads((output_dir / "all_results.json").read_text()), wall


def measure_llm() -> str:
    with tempfile.TemporaryDirectory() as work:
        trained, wall = _lathe_train(Path(work) / "trained")
        untrained, _ = _lathe_train(Path(work) / "untrained", "do_train=false")
        predictions = (Path(work) / "trained" / "generated_predictions.jsonl").read_text().splitlines()
        state = json.loads((Path(work) / "trained" / "trainer_state.json").read_text())
    right = sum(json.loads(line)["predict"].strip() == json.loads(line)["label"].strip() for line in predictions)
    numbers = {
        "exact": trained["predict_exact_match"],
        "right": right,
        "total": len(predictions),
        "untrained": untrained["predict_exact_match"],
        "wall_s": wall,
        "train_s": trained["train_runtime"],
        "steps": state["global_step"],
    }
    return render_llm(numbers)


def render_busy(wall_s: float, train_s: float, load: tuple[float, float], cores: int) -> str:
    return (
        f"{wall_s:.0f} s wall ({train_s:.0f} s of training) with a load average of {load[0]:.1f}–{load[1]:.1f} "
        f"on its {cores} cores"
    )


def measure_busy() -> str:
    """The LLM quickstart's training run alone, timed with the 1-minute load average before and after it."""
    import os

    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as work:
        trained, wall = _lathe_train(Path(work) / "trained")
    after = os.getloadavg()[0]
    return render_busy(wall, trained["train_runtime"], (min(before, after), max(before, after)), os.cpu_count() or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", action="store_true", help="also run the LLM quickstart (about 1.5 min)")
    parser.add_argument("--check", action="store_true", help="compare with the README instead of rewriting it")
    parser.add_argument("--keep-timings", action="store_true", help="rewrite the scores, keep the README's timings")
    parser.add_argument("--busy", action="store_true", help="only the LLM quickstart's timing under today's load")
    options = parser.parse_args(argv)
    text = README.read_text()
    if options.busy:
        new = measure_busy()
        print(f"quickstart-llm-busy: {new}")
        README.write_text(replace_region(text, "quickstart-llm-busy", new))
        return 0
    measured = {"quickstart-mlp": (measure_mlp(), stable_mlp)}
    if options.llm:
        measured["quickstart-llm"] = (measure_llm(), stable_llm)
    stale = []
    for name, (new, stable) in measured.items():
        print(f"{name}: {new}")
        if options.check:
            written = regions(text).get(name, "")
            if stable(written) != stable(new):
                stale.append(f"{name}: README has {stable(written)}, a run gives {stable(new)}")
        else:
            if options.keep_timings:
                new = keep_timings(name, regions(text).get(name, ""), new)
            text = replace_region(text, name, new)
    if options.check:
        print("\n".join(stale) or "README.md's numbers are current")
        return 1 if stale else 0
    README.write_text(text)
    print(f"rewrote {', '.join(measured)} in {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
