"""Runs transformers' own Trainer tests twice, on transformers and with lathe's Trainer-side names swapped in.

    bench/hf_trainer_tests.py fetch [--ref v5.23.0]   # once, where GitHub is reachable: the test files
    bench/hf_trainer_tests.py run                     # both runs, the census, the classification, the report

The test files (tests/trainer/*, tests/utils/test_hf_argparser.py of huggingface/transformers) live under
bench/.cache/transformers/ (git-ignored; never committed). `run` uses bench/.venv-peers (transformers 5.23.0,
accelerate 1.15.0, torch CPU; needs pytest, pytest-timeout, parameterized, datasets) with the worktree's lathe on
PYTHONPATH, offline (HF_HUB_OFFLINE=1) and on the CPU. Each test ends in one category:
  skipped            skipped on transformers here (GPU, slow/hub, optional package)
  fails upstream     fails on transformers itself here (mostly: needs the hub; or uses names 5.23 removed)
  private helper / accelerate internals / does not use a replaced name   (rules in bench/hf_trainer_classify.py)
  public behaviour   passes on transformers: the count that matters, and whether it passes on lathe
Writes bench/results/hf_trainer_tests.json and .md (override with --out) and prints the summary.
"""

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from hf_trainer_classify import classify  # noqa: E402

TESTS_DIR = BENCH / ".cache" / "transformers"
# The files and the copies measured here: (path, where the copy came from, sha256). The store that served them
# names a commit for most; "index version" marks copies whose commit it did not name.
MANIFEST = [
    (
        "tests/trainer/trainer_test_utils.py",
        "fef6f3591b8998bd9ddd80b793b25e0c861ca3c7",
        "65107d078326422bad61a2f4f5d0fa0a7d6076abee23012573eee5fcac956249",
    ),
    (
        "tests/trainer/test_trainer.py",
        "index version 6551267792",
        "b38b5babcb1d8348299e463ec7db960e63ad671406af9541f30c8d39b1401da5",
    ),
    (
        "tests/trainer/test_trainer_callback.py",
        "020a37d2264e60dc7beb9634c3e87ad870073e2c",
        "afdf7ee0d7ee5f126df64a3ae66c302f12a944bca2b8077a555b77e4174b3bba",
    ),
    (
        "tests/trainer/test_data_collator.py",
        "index version 3663700966",
        "85e657e436234523bcd436e92819b88efacb13b145b7a8bfc0d943aa7540b327",
    ),
    (
        "tests/trainer/test_trainer_checkpointing.py",
        "abee4b14abf32637fe72990d0c409eaba189b31a",
        "fa731236d01d4189a302d0f619c375ef71b081cc5486f99e5fe97bc78c7c5475",
    ),
    (
        "tests/trainer/test_trainer_resume.py",
        "37ff9888a5faa033e5579a42e611f8ad7cdbaed7",
        "bf262b9d9662a8a2ff88a3e9de4e472beae43ab4bad99839139c88abaf986680",
    ),
    (
        "tests/trainer/test_trainer_evaluation.py",
        "d7f1740350ba292a268a0f4531dff14aca025403",
        "bdf79c75a3e91649bb1517d43efd8f8f13918ca3d7d6e1cb815a238131622dff",
    ),
    (
        "tests/trainer/test_trainer_optimizers.py",
        "0d7e95d96b4e187c651e2b2406ed98ed40d74963",
        "243c6cae019b6f7d01da33526d0e04d550af650ad4b1769609340901a5c8fbb3",
    ),
    (
        "tests/trainer/test_training_args.py",
        "34de825520ff42f3bf328e7ab4ec39b5b0a73f94",
        "30fc1b772a765da83276cc8f67b7afb20fe7ebcad18d0019ae96433a18734533",
    ),
    (
        "tests/trainer/test_trainer_seq2seq.py",
        "01ae98ae2414210efd0d9ac1ffe78ff21588f1f7",
        "54017f32bbe2e93c4b0b055d20533c1806ce654c626a61369b484f5bcf6636ad",
    ),
    (
        "tests/trainer/test_gradient_clipping.py",
        "035e2cd8bb8597b0999039b1dad9b27b26d20012",
        "0536337dfd59cd679cc0d0da99191929ddb40c6804799e18188a69b5582c1166",
    ),
    (
        "tests/trainer/test_loss_reduction.py",
        "0b28e7f48825b3d9c293352cbb3d585c30492b1d",
        "9c93d80d5679cafdb3f95c23ab2a358c4d0be4d7d7e2321ea45b43ca8a08300f",
    ),
    (
        "tests/utils/test_hf_argparser.py",
        "01c2043fe845aa4ef1f42a23d9d7a346f36198e0",
        "6daaff492afe1bcb90cc5586c57aae69412478493148ece76f6d4790655bcdb9",
    ),
]
PACKAGE_FILES = ["tests/__init__.py", "tests/trainer/__init__.py", "tests/utils/__init__.py"]
HUB_MARKERS = (
    "offline",
    "hub",
    "huggingface.co",
    "localentrynotfound",
    "connection",
    "can't load",
    "couldn't",
    "not a valid model identifier",
    "is not a local folder",
    "sample_text.txt",
)


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def fetch(ref, tests_dir):
    """Download the files at `ref` from GitHub; report any that differ from the copies measured here."""
    for path in PACKAGE_FILES:
        (tests_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (tests_dir / path).touch()
    for path, source, digest in MANIFEST:
        url = f"https://raw.githubusercontent.com/huggingface/transformers/{ref}/{path}"
        target = tests_dir / path
        try:
            data = urllib.request.urlopen(url, timeout=60).read()
        except OSError as error:
            sys.exit(
                f"fetch: {url}: {error}. Without access to GitHub, place the files listed in MANIFEST "
                f"(bench/hf_trainer_tests.py) under {tests_dir} by hand."
            )
        target.write_bytes(data)
        same = hashlib.sha256(data).hexdigest() == digest
        print(f"{path}: {'same as' if same else 'DIFFERS from'} the copy measured here ({source})")


def check_tests(tests_dir):
    missing = [p for p, _, _ in MANIFEST if not (tests_dir / p).is_file()]
    if missing:
        sys.exit(f"missing test files under {tests_dir}: {missing}; run `{Path(__file__).name} fetch` first")
    for path in PACKAGE_FILES:
        (tests_dir / path).touch()
    return {
        p: {"source": s, "sha256": sha256(tests_dir / p), "as_measured": sha256(tests_dir / p) == d}
        for p, s, d in MANIFEST
    }


def environment(swap, results, swaplog):
    env = dict(os.environ)
    paths = [str(BENCH)] + ([str(REPO)] if swap else [])
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        HF_TESTS_RESULTS=str(results),
        HF_TESTS_SWAP="1" if swap else "0",
        HF_TESTS_SWAPLOG=str(swaplog),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        WANDB_DISABLED="true",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def run_side(python, tests_dir, work, swap, timeout, reuse=False):
    """One pytest run (or, with reuse, the last one's records); returns (records by nodeid, seconds, swap log)."""
    side = "lathe" if swap else "transformers"
    scratch = work / side
    scratch.mkdir(parents=True, exist_ok=True)
    results, swaplog = work / f"{side}.jsonl", work / f"{side}-swap.json"
    if reuse:
        return _records(results), float((work / f"{side}.seconds").read_text()), _swap_log(swap, swaplog)
    results.unlink(missing_ok=True)
    command = [
        python,
        "-m",
        "pytest",
        "-p",
        "hf_trainer_swap",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rN",
        "--timeout",
        str(timeout),
        "-o",
        "addopts=",
        "--rootdir",
        str(tests_dir),
        *[str(tests_dir / p) for p, _, _ in MANIFEST if "/test_" in p],
    ]
    start = time.perf_counter()
    completed = subprocess.run(
        command,
        cwd=scratch,
        env=environment(swap, results, swaplog),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seconds = time.perf_counter() - start
    (work / f"{side}.log").write_text(completed.stdout)
    (work / f"{side}.seconds").write_text(f"{seconds:.1f}")
    if not results.exists():
        sys.exit(f"{side} run recorded nothing; see {work / f'{side}.log'}:\n{completed.stdout[-3000:]}")
    return _records(results), seconds, _swap_log(swap, swaplog)


def _records(results):
    records = {}
    for line in results.read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["nodeid"], record)  # first decisive phase wins (setup error before call)
    return records


def _swap_log(swap, swaplog):
    return json.loads(swaplog.read_text()) if swap and swaplog.exists() else {}


def census(python):
    env = environment(True, Path(os.devnull), Path(os.devnull))
    output = subprocess.run(
        [python, str(BENCH / "hf_trainer_census.py")], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(output.stdout)


def upstream_category(record):
    if record["outcome"] == "skipped":
        message = record.get("message", "").lower()
        if "accelerator" in message or "gpu" in message or "cuda" in message:
            return "skipped: needs an accelerator"
        if "slow" in message or "staging" in message:
            return "skipped: slow or staging-hub test"
        return "skipped: optional package or other"
    message = record.get("message", "").lower()
    if any(marker in message for marker in HUB_MARKERS):
        return "fails on transformers here: needs the hub"
    return "fails on transformers here: other"


def tally(transformers_records, lathe_records, tests_dir, replaced_names):
    passed_upstream = [n for n, r in transformers_records.items() if r["outcome"] == "passed"]
    rules = classify(tests_dir, [n for n in passed_upstream if "::" in n], replaced_names)
    tests = {}
    for nodeid, record in sorted(transformers_records.items()):
        entry = {"transformers": record["outcome"], "transformers_message": record.get("message", "")}
        if record["outcome"] != "passed":
            entry["category"] = upstream_category(record)
        else:
            category, reason = rules.get(nodeid, (None, ""))
            entry["category"] = category or "public behaviour"
            if reason:
                entry["reason"] = reason
            lathe = lathe_records.get(nodeid, {"outcome": "not run", "message": "absent from the lathe run"})
            entry["lathe"] = lathe["outcome"]
            if lathe["outcome"] != "passed":
                entry["lathe_message"] = lathe.get("message", "")
        tests[nodeid] = entry
    return tests


def summary(tests):
    counts = {}
    for entry in tests.values():
        counts[entry["category"]] = counts.get(entry["category"], 0) + 1
    public = {n: e for n, e in tests.items() if e["category"] == "public behaviour"}
    passing = sorted(n for n, e in public.items() if e["lathe"] == "passed")
    failing = {n: e.get("lathe_message", "") for n, e in sorted(public.items()) if e["lathe"] != "passed"}
    return {
        "categories": counts,
        "public_behaviour": len(public),
        "public_passing_on_lathe": len(passing),
        "lathe_failures": failing,
    }


def write_markdown(path, report):
    s, c = report["summary"], report["census"]
    lines = [
        f"# transformers Trainer tests on lathe ({report['date']})",
        "",
        f"transformers {report['versions']['transformers']}, accelerate {report['versions']['accelerate']}, "
        f"torch {report['versions']['torch']}; runs took {report['seconds']['transformers']:.0f} s "
        f"(transformers) and {report['seconds']['lathe']:.0f} s (lathe).",
        "",
        f"**Public-behaviour tests passing on transformers: {s['public_behaviour']}; passing on lathe: "
        f"{s['public_passing_on_lathe']}.**",
        "",
        f"Public names missing from lathe: {c['total_missing']} of {c['total_transformers']}.",
        "",
        "| category | tests |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in sorted(s["categories"].items())],
        "",
        "## Public-behaviour tests failing on lathe",
        "",
        *[f"- `{n}`: {m}" for n, m in s["lathe_failures"].items()],
        "",
        "## Excluded by the private/accelerate/not-Trainer-side rules",
        "",
        *[
            f"- `{n}` ({e['category']}: {e.get('reason', '')})"
            for n, e in report["tests"].items()
            if e["category"] in ("private helper", "accelerate internals", "does not use a replaced name")
        ],
        "",
        "## Missing public names",
        "",
        *[
            f"- {k} ({len(v['missing'])} of {v['transformers']}): {', '.join(v['missing']) or 'none'}"
            for k, v in c["classes"].items()
        ],
        "",
        "## Names the swap stubbed (transformers defines them, lathe's module lacks them)",
        "",
        *[f"- {k}: {', '.join(v)}" for k, v in sorted(report["swap"].get("stubbed", {}).items())],
        "",
    ]
    Path(path).write_text("\n".join(lines))


def versions(python):
    code = (
        "import json,torch,transformers,accelerate;print(json.dumps({'torch':torch.__version__,"
        "'transformers':transformers.__version__,'accelerate':accelerate.__version__}))"
    )
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def run(arguments):
    tests_dir = Path(arguments.tests_dir).resolve()
    files = check_tests(tests_dir)
    work = BENCH / ".cache" / "hf-trainer-runs"
    work.mkdir(parents=True, exist_ok=True)
    reuse = arguments.reuse_results
    upstream, upstream_seconds, _ = run_side(arguments.python, tests_dir, work, False, arguments.timeout, reuse)
    ours, our_seconds, swap_log = run_side(arguments.python, tests_dir, work, True, arguments.timeout, reuse)
    replaced = {n for group in ("replaced", "stubbed") for names in swap_log.get(group, {}).values() for n in names}
    tests = tally(upstream, ours, tests_dir, replaced)
    report = {
        "date": datetime.date.today().isoformat(),
        "versions": versions(arguments.python),
        "files": files,
        "seconds": {"transformers": upstream_seconds, "lathe": our_seconds},
        "summary": summary(tests),
        "census": census(arguments.python),
        "swap": swap_log,
        "tests": tests,
    }
    out = Path(arguments.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, sort_keys=True))
    write_markdown(out.with_suffix(".md"), report)
    s = report["summary"]
    print(
        f"public-behaviour tests passing on transformers: {s['public_behaviour']}; "
        f"passing on lathe: {s['public_passing_on_lathe']}"
    )
    print(
        f"public names missing from lathe: {report['census']['total_missing']} of "
        f"{report['census']['total_transformers']}"
    )
    for category, count in sorted(s["categories"].items()):
        print(f"  {count:4d}  {category}")
    for nodeid, message in s["lathe_failures"].items():
        print(f"FAIL on lathe: {nodeid}: {message}")
    print(f"runs: {upstream_seconds:.0f} s + {our_seconds:.0f} s; report: {out.with_suffix('.md')}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_parser = commands.add_parser("fetch", help="download the test files from GitHub")
    fetch_parser.add_argument("--ref", default="v5.23.0", help="tag or commit of huggingface/transformers")
    run_parser = commands.add_parser("run", help="run both sides and write the report")
    run_parser.add_argument("--python", default=str(BENCH / ".venv-peers" / "bin" / "python"))
    run_parser.add_argument("--timeout", type=int, default=300, help="seconds per test before it counts as failed")
    run_parser.add_argument("--out", default=str(BENCH / "results" / "hf_trainer_tests"))
    run_parser.add_argument(
        "--reuse-results",
        action="store_true",
        help="classify and report the last runs' records again without running the tests",
    )
    for sub in (fetch_parser, run_parser):
        sub.add_argument("--tests-dir", default=str(TESTS_DIR))
    arguments = parser.parse_args()
    if arguments.command == "fetch":
        fetch(arguments.ref, Path(arguments.tests_dir))
    else:
        run(arguments)


if __name__ == "__main__":
    main()
