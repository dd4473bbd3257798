"""Per-step instruction counts of the regression job (plain loop vs lathe), load-independent, under callgrind.

Wall and CPU times on a shared machine move with the other work on it; instructions executed do not.
Each runner trains the regression job twice under `valgrind --tool=callgrind`, with instrumentation
switched on only around its train call (a callgrind client request from a tiny C library built here),
for `--epochs` A and B; the difference divided by the extra steps is the cost of one step, with the
fixed costs (optimizer creation, first-call set-up) cancelled out.

    python bench/count_instructions.py                     # plain and lathe, 1 vs 3 epochs (~10 min)
    python bench/count_instructions.py --runners lathe --epochs 1 2

Needs valgrind with its headers (callgrind.h) and a C compiler. Under callgrind a run is ~50x slower.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RUNNERS = {
    "plain": ["run_plain.py", "--job", "regression"],
    "lathe": ["run_trainer.py", "--impl", "lathe", "--job", "regression"],
    "hf": ["run_trainer.py", "--impl", "hf", "--job", "regression"],
}
TOGGLE_C = """#include <valgrind/callgrind.h>
void cg_on(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_off(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS; }
"""


def child(library: str, epochs: int, argv: list[str]) -> None:
    """Inside valgrind: set the job's epochs, count only the train call, run the runner as __main__."""
    import contextlib
    import dataclasses
    import runpy

    sys.path.insert(0, str(BENCH))
    import jobs
    import measure

    toggle = ctypes.CDLL(library)
    jobs.JOBS["regression"] = dataclasses.replace(jobs.JOBS["regression"], epochs=epochs)

    @contextlib.contextmanager
    def counted():  # replaces the cProfile hook both runners put around their train call
        toggle.cg_on()
        try:
            yield
        finally:
            toggle.cg_off()

    measure.profile_if_requested = counted
    sys.argv = [str(BENCH / argv[0]), *argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")


def count(runner: str, epochs: int, library: str, workdir: Path) -> int:
    """Instructions of `runner`'s train call at `epochs` epochs (the dump the client request made)."""
    out = workdir / f"{runner}-{epochs}.cg"
    command = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p",
        sys.executable, __file__, "--child", library, str(epochs), *RUNNERS[runner],
        "--out", str(workdir / f"{runner}-{epochs}.json"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(BENCH.parent)}
    subprocess.run(command, check=True, env=env, cwd=BENCH.parent, capture_output=True)
    totals = [
        int(line.split()[1])
        for dump in workdir.glob(f"{runner}-{epochs}.cg.*")
        for line in dump.read_text().splitlines()
        if line.startswith("totals:")
    ]
    return max(totals)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runners", default="plain,lathe", help="comma-separated: plain, lathe, hf")
    parser.add_argument("--epochs", type=int, nargs=2, default=(1, 3), metavar=("A", "B"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lathe-callgrind-"))
    library = str(workdir / "libcgtoggle.so")
    (workdir / "toggle.c").write_text(TOGGLE_C)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", library, str(workdir / "toggle.c")], check=True)
    sys.path.insert(0, str(BENCH))
    import jobs

    steps_per_epoch = jobs.JOBS["regression"].steps_per_epoch
    per_step = {}
    for runner in args.runners.split(","):
        low, high = (count(runner, epochs, library, workdir) for epochs in args.epochs)
        per_step[runner] = (high - low) / ((args.epochs[1] - args.epochs[0]) * steps_per_epoch)
        print(f"{runner}: {low:,} / {high:,} instructions at {args.epochs[0]} / {args.epochs[1]} epochs; "
              f"{per_step[runner]:,.0f} per step")  # fmt: skip
    if "plain" in per_step:
        for runner, value in per_step.items():
            if runner != "plain":
                print(f"{runner} / plain per step: {value / per_step['plain']:.3f}x")


if __name__ == "__main__":
    main()
