"""Run every benchmark: plain loop vs transformers.Trainer vs lathe.Trainer, then write the report.

    bench/setup_peers.sh                      # once: bench/.venv-peers
    python bench/run_all.py                   # full run (~15 min), writes docs/BENCHMARKS.md
    python bench/run_all.py --quick           # smoke run (~1 min), writes bench/results/BENCHMARKS-quick.md

Every measurement is a fresh subprocess of the same interpreter (bench/.venv-peers/bin/python by
default) with OMP_NUM_THREADS=1, and the runners are interleaved (plain, hf, lathe, plain, hf, ...)
so machine noise hits all of them alike. Raw results go to bench/results/*.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_PYTHON = BENCH_DIR / ".venv-peers" / "bin" / "python"
RUNNERS = ("plain", "hf", "lathe")
# label -> (untimed setup, timed statement); each runs in a fresh process.
IMPORT_STATEMENTS = {
    "python -c pass": ("", "pass"),
    "import torch": ("", "import torch"),
    "import lathe": ("", "import lathe"),
    "from lathe import Trainer, TrainingArguments": ("", "from lathe import Trainer, TrainingArguments"),
    "from transformers import Trainer, TrainingArguments": ("", "from transformers import Trainer, TrainingArguments"),
    # What each trainer adds on top of an already imported torch: the import-overhead target.
    "import torch; then from lathe import Trainer, TrainingArguments": (
        "import torch",
        "from lathe import Trainer, TrainingArguments",
    ),
    "import torch; then from transformers import Trainer, TrainingArguments": (
        "import torch",
        "from transformers import Trainer, TrainingArguments",
    ),
}


def child_environment() -> dict:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        # lathe is imported from this checkout; every runner gets the same sys.path.
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    return env


NICENESS = 0  # set from --nice: children run at this nice increment (negative = higher priority, needs root)


def raise_priority() -> None:
    """Child-side (preexec): apply NICENESS to the process and to its session's scheduler autogroup.

    With sched_autogroup (on here) CPU is shared fairly between sessions first, so a plain nice
    value only ranks processes within our own new session; the autogroup's nice is what counts.
    """
    os.nice(NICENESS)
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write(str(NICENESS))
    except OSError:
        pass


def spawn(command: list[str], timeout: float = 900) -> dict:
    """Run one measurement process; return its wall time, exit code, peak RSS and CPU time (from wait4)."""
    env = child_environment()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = RESULTS_DIR / "last_stdout.txt", RESULTS_DIR / "last_stderr.txt"
    with open(stdout_path, "w") as stdout, open(stderr_path, "w") as stderr:
        env["BENCH_SPAWN_TIME"] = repr(time.time())
        start = time.perf_counter()
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=raise_priority if NICENESS else None,
        )
        killer = threading.Timer(timeout, lambda: os.killpg(process.pid, signal.SIGKILL))
        killer.start()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        killer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
    return {
        "command": shlex.join(command),
        "rc": process.returncode,
        "wall_s": wall,
        "maxrss_mb": usage.ru_maxrss / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "stdout": stdout_path.read_text()[-4000:],
        "stderr": stderr_path.read_text()[-4000:],
    }


def runner_command(python: str, runner: str, job: str, quick: bool, out: Path, extra=()) -> list[str]:
    if runner == "plain":
        command = [python, "bench/run_plain.py"]
    else:
        command = [python, "bench/run_trainer.py", "--impl", runner]
    command += ["--job", job, "--out", str(out), "--output-dir", f"bench/results/tmp/{runner}", *extra]
    return command + (["--quick"] if quick else [])


def run_measured(python: str, runner: str, job: str, quick: bool, extra=()) -> dict:
    out = RESULTS_DIR / "tmp" / f"{runner}-{job}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    record = spawn(runner_command(python, runner, job, quick, out, extra))
    record.update(runner=runner, job=job)
    if record["rc"] == 0 and out.exists():
        record["result"] = json.loads(out.read_text())
        record.pop("stdout"), record.pop("stderr")
    else:
        record["error"] = (record["stderr"] or record["stdout"])[-3000:]
    return record


def note(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def machine_info(python: str) -> dict:
    versions = subprocess.run(
        [
            python,
            "-c",
            "import json, torch, transformers, accelerate, tokenizers, safetensors; "
            "print(json.dumps({m.__name__: m.__version__ for m in "
            "(torch, transformers, accelerate, tokenizers, safetensors)}))",
        ],
        capture_output=True,
        text=True,
        env=child_environment(),
    )
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    memory_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    lathe_commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip()
    lathe_dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "lathe"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / 2**20, 1),
        "os": platform.platform(),
        "python": subprocess.run([python, "-V"], capture_output=True, text=True).stdout.strip(),
        "versions": json.loads(versions.stdout) if versions.returncode == 0 else versions.stderr[-500:],
        "lathe_commit": lathe_commit + (" + uncommitted changes in lathe/" if lathe_dirty else ""),
        "threads": 1,
        "load_average_start": os.getloadavg(),
    }


def check_lathe(python: str) -> dict:
    record = spawn([python, "-c", "from lathe import Trainer, TrainingArguments"], timeout=120)
    return {"available": record["rc"] == 0, "error": record["stderr"][-2000:] if record["rc"] else None}


def measure_imports(python: str, repeats: int, lathe_available: bool, warm_up: bool = True) -> dict:
    """In-process import time and whole-process wall time of each statement, one fresh process each."""
    timings = {label: [] for label in IMPORT_STATEMENTS}
    for round_index in range(0 if warm_up else 1, repeats + 1):  # round 0 warms the page cache, discarded
        for label, (setup, statement) in IMPORT_STATEMENTS.items():
            if "lathe" in statement and not lathe_available:
                continue
            code = (
                f"import time; {setup or 'pass'}; t, c = time.perf_counter(), time.process_time(); {statement}; "
                "print(time.perf_counter() - t, time.process_time() - c)"
            )
            record = spawn([python, "-c", code], timeout=120)
            if round_index and record["rc"] == 0:
                in_process_s, in_process_cpu_s = map(float, record["stdout"].split()[-2:])
                timings[label].append(
                    {
                        "in_process_s": in_process_s,
                        "in_process_cpu_s": in_process_cpu_s,
                        "wall_s": record["wall_s"],
                        "maxrss_mb": record["maxrss_mb"],
                    }
                )
            elif record["rc"]:
                timings[label].append({"error": record["stderr"][-1000:]})
    return timings


def measure_cli(python: str, repeats: int) -> dict:
    """`python -m lathe --help` (this interpreter) and the installed `lathe --help` console script."""
    commands = {"python -m lathe --help": [python, "-m", "lathe", "--help"]}
    if shutil.which("lathe"):
        commands["lathe --help"] = [shutil.which("lathe"), "--help"]
    results = {}
    for label, command in commands.items():
        first = spawn(command, timeout=60)
        if first["rc"] != 0:
            results[label] = {
                "available": False,
                "error": (first["stderr"] or first["stdout"])[-1500:],
                "command": first["command"],
            }
            continue
        walls = [spawn(command, timeout=60)["wall_s"] for _ in range(repeats)]
        results[label] = {"available": True, "wall_s": walls, "command": first["command"]}
    return results


def measure_eval_memory(python: str, runners: list[str], quick: bool) -> list[dict]:
    records = []
    for metrics in ("loss",) if quick else ("loss", "accuracy"):
        for runner in runners:
            if runner == "plain" and metrics != "loss":
                continue
            for scale in (1, 10):
                extra = ["--mode", "evalmem", "--eval-scale", str(scale), "--eval-metrics", metrics]
                record = run_measured(python, runner, "lm", quick, extra)
                record.update(eval_scale=scale, eval_metrics=metrics)
                note(
                    f"evalmem {runner:5s} {metrics:8s} x{scale:<2d} rc={record['rc']} "
                    f"peak={record.get('result', {}).get('eval_peak_rss_mb', float('nan')):.0f} MB"
                )
                records.append(record)
    return records


def profile_runner(python: str, runner: str, job: str, quick: bool, top: int = 15) -> dict:
    """One extra cProfile'd run of the training call; keep the top functions by own time and per-package totals."""
    import pstats

    profile_path = RESULTS_DIR / "tmp" / f"profile-{runner}-{job}.prof"
    profile_path.parent.mkdir(parents=True, exist_ok=True)
    os.environ["BENCH_PROFILE"] = str(profile_path)
    try:
        record = run_measured(python, runner, job, quick)
    finally:
        del os.environ["BENCH_PROFILE"]
    if record["rc"] or not profile_path.exists():
        return {"runner": runner, "job": job, "error": record.get("error", "no profile written")}
    stats = pstats.Stats(str(profile_path)).stats  # {(file, line, name): (cc, ncalls, tottime, cumtime, callers)}

    def where(file: str) -> str:
        for marker, package in (
            ("/lathe/", "lathe"),
            ("/transformers/", "transformers"),
            ("/accelerate/", "accelerate"),
            ("/torch/", "torch (Python)"),
            ("/bench/", "bench (model, dataset)"),
        ):
            if marker in file:
                return package
        return "torch C++ / builtins" if file == "~" else "other Python"

    packages: dict[str, float] = {}
    for (file, _, _), (_, _, tottime, _, _) in stats.items():
        packages[where(file)] = packages.get(where(file), 0.0) + tottime
    rows = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    return {
        "runner": runner,
        "job": job,
        "steps": record["result"]["global_step"],
        "total_s": sum(v[2] for v in stats.values()),
        "packages": packages,
        "top": [
            {
                "function": f"{os.path.relpath(f, REPO_ROOT) if f.startswith('/') else f}:{line}({name})",
                "ncalls": v[1],
                "tottime": v[2],
                "cumtime": v[3],
            }
            for (f, line, name), v in rows
        ],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small jobs, 1 repeat: a smoke run")
    parser.add_argument("--repeats", type=int, help="repeats per runner and job (default 11 regression / 5 lm)")
    parser.add_argument("--jobs", default="regression,lm")
    parser.add_argument("--runners", default=",".join(RUNNERS))
    parser.add_argument("--python", default=str(DEFAULT_PYTHON), help="interpreter for every child process")
    parser.add_argument("--skip", default="", help="comma list of: imports,cli,train,profile,evalmem")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the children at this nice increment, e.g. -10 (root) on a machine shared with "
        "other work, so that every runner gets a whole core",
    )
    parser.add_argument("--report", help="markdown output (default docs/BENCHMARKS.md, quick: bench/results/)")
    args = parser.parse_args()
    if not Path(args.python).exists():
        sys.exit(f"{args.python} not found: run bench/setup_peers.sh first (or pass --python)")
    skip = set(filter(None, args.skip.split(",")))
    global NICENESS
    NICENESS = args.nice
    runners = args.runners.split(",")
    started = datetime.datetime.now(datetime.timezone.utc)

    meta = machine_info(args.python)
    meta.update(
        started=started.isoformat(timespec="seconds"),
        quick=args.quick,
        nice=args.nice,
        command="python " + shlex.join([os.path.relpath(__file__, REPO_ROOT), *sys.argv[1:]]),
    )
    note(f"machine: {meta['cpu']} x{meta['cores']}, load {meta['load_average_start']}")
    lathe = check_lathe(args.python)
    if not lathe["available"]:
        note("lathe is not importable; its column stays pending:\n" + lathe["error"])
        runners = [r for r in runners if r != "lathe"]
    prepare = spawn([args.python, "bench/jobs.py", "prepare"], timeout=600)
    if prepare["rc"]:
        sys.exit("preparing the lm assets failed:\n" + prepare["stderr"])

    results = {
        "meta": meta,
        "lathe": lathe,
        "runners": runners,
        "imports": {},
        "cli": {},
        "runs": [],
        "profiles": [],
        "evalmem": [],
    }
    import_repeats = 1 if args.quick else 5
    if "imports" not in skip:
        note("import times")
        results["imports"] = measure_imports(args.python, import_repeats, lathe["available"], warm_up=not args.quick)
    if "cli" not in skip and lathe["available"]:
        note("lathe --help")
        results["cli"] = measure_cli(args.python, import_repeats)
    if "train" not in skip:
        for job in args.jobs.split(","):
            repeats = args.repeats or (1 if args.quick else (11 if job == "regression" else 5))
            for repeat in range(repeats):
                for runner in runners:  # interleaved: plain, hf, lathe, plain, hf, lathe, ...
                    record = run_measured(args.python, runner, job, args.quick)
                    record["repeat"] = repeat
                    results["runs"].append(record)
                    summary = record.get("result", {})
                    note(
                        f"{job:10s} {runner:5s} #{repeat} rc={record['rc']} wall={record['wall_s']:.1f}s "
                        f"train={summary.get('train_s', float('nan')):.2f}s "
                        f"loss={summary.get('final_loss', float('nan')):.6f}"
                    )
                    if record["rc"]:
                        note("  error: " + record["error"].strip().splitlines()[-1])
    if not args.quick and "profile" not in skip and "train" not in skip:
        for runner in runners:
            note(f"profile {runner} on regression")
            results["profiles"].append(profile_runner(args.python, runner, "regression", args.quick))
    if "evalmem" not in skip:
        results["evalmem"] = measure_eval_memory(args.python, runners, args.quick)
    shutil.rmtree(RESULTS_DIR / "tmp", ignore_errors=True)

    meta["load_average_end"] = os.getloadavg()
    meta["duration_s"] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    stamp = started.strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
    results_path = RESULTS_DIR / f"run-{stamp}.json"
    meta["results_file"] = os.path.relpath(results_path, REPO_ROOT)
    results_path.write_text(json.dumps(results, indent=1))

    import report  # noqa: E402  (bench/ is on sys.path: this script's folder)

    report_path = (
        Path(args.report)
        if args.report
        else (RESULTS_DIR / "BENCHMARKS-quick.md" if args.quick else REPO_ROOT / "docs" / "BENCHMARKS.md")
    )
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(report.render(results, results_path))
    note(f"results: {results_path}\nreport: {report_path} ({meta['duration_s']:.0f} s in all)")


if __name__ == "__main__":
    main()
