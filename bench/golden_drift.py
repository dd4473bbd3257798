"""How far golden numbers move on another CPU: golden tests rerun under several kernel settings.

Each setting is one pytest run of the given tests (default: GOLDEN_TESTS) in a subprocess with
`LATHE_GOLDEN_REPORT` set, so tests/goldens.py records, for every comparison with a recorded file, the largest
absolute and relative difference. The settings stand in for other machines: PyTorch's kernels of another CPU
(`ATEN_CPU_CAPABILITY`), MKL's code path of another CPU (`MKL_ENABLE_INSTRUCTIONS`, oneDNN's
`ONEDNN_MAX_CPU_ISA`), numpy's OpenBLAS kernels of another CPU (`OPENBLAS_CORETYPE`), and another thread count (`LATHE_TEST_THREADS`, read by tests/conftest.py). The tests
pass or fail under the golden tolerance; the table is what docs/GOLDENS.md reports.

    python bench/golden_drift.py                        # all settings, GOLDEN_TESTS; a markdown table
    python bench/golden_drift.py --settings default-isa tests/llm/test_optim_methods.py -k baseline
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "as-is": {},
    "default-isa": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl-sse4": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "2-threads": {"LATHE_TEST_THREADS": "2", "OMP_NUM_THREADS": "2"},
    "openblas-sse3": {"OPENBLAS_CORETYPE": "Prescott"},  # numpy's OpenBLAS (audio features) on an old CPU's kernels
    "numpy-v2": {"NPY_DISABLE_CPU_FEATURES": "X86_V3"},  # numpy's own loops (log10, ...) without AVX2/FMA
}
# One or more golden comparisons of each kind: step losses, norms and weights of several optimizers; preference
# logs; multimodal batches (images, audio features) and training; GRPO logs.
GOLDEN_TESTS = [
    "tests/llm/test_optim_methods.py::test_step_losses_equal_llamafactory",
    "tests/llm/test_preference_golden.py::test_training_logs_with_full_logits_equal_llamafactory_bit_for_bit",
    "tests/llm/test_methods.py",
    "tests/llm/test_multimodal_families.py",
    "tests/llm/test_multimodal_families_train.py",
    "tests/llm/test_multimodal_train.py",
    "tests/llm/test_grpo_golden.py",
]


def run_setting(name: str, tests: list[str]) -> tuple[int, dict]:
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.jsonl"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        env.update(SETTINGS[name], LATHE_GOLDEN_REPORT=str(report))
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=line", *tests]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        lines = result.stdout.strip().splitlines() or result.stderr[-500:].splitlines()
        print(f"{name}: {lines[-1] if lines else ''}")
        for line in lines:
            if line.startswith("FAILED") or "differ from the golden" in line or line.startswith("      "):
                print("   ", line[:300])
        worst: dict = {}
        for line in report.read_text().splitlines() if report.exists() else []:
            entry = json.loads(line)
            what = entry["what"].split(",")[0]  # "case logs, step 3" counts as "case logs"
            old = worst.get(what, {"abs": 0.0, "rel": 0.0, "used": 0.0})
            worst[what] = {key: max(old[key], entry[key]) for key in ("abs", "rel", "used")}
        return result.returncode, worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--json", help="also write the results here")
    args, tests = parser.parse_known_args(argv)
    results = {name: run_setting(name, tests or GOLDEN_TESTS) for name in args.settings.split(",")}
    names = sorted({what for _, worst in results.values() for what in worst})
    print("\nper setting: largest relative, absolute difference, share of the tolerance used (1.00: at the limit)")
    print("\n| golden | " + " | ".join(results) + " |\n|---|" + "---|" * len(results))
    for what in names:
        cells = [
            f"{worst[what]['rel']:.1e} rel, {worst[what]['abs']:.1e} abs, {worst[what]['used']:.2f}"
            if what in worst
            else "-"
            for _, worst in results.values()
        ]
        print(f"| {what} | " + " | ".join(cells) + " |")
    for name, (_, worst) in results.items():
        if worst:
            print(f"{name}: largest {max(w['rel'] for w in worst.values()):.2e} relative,", end=" ")
            print(f"{max(w['abs'] for w in worst.values()):.2e} absolute,", end=" ")
            print(f"{max(w['used'] for w in worst.values()):.2f} of the tolerance, over {len(worst)} comparisons")
    if args.json:
        Path(args.json).write_text(json.dumps({name: worst for name, (_, worst) in results.items()}, indent=1))
    return max(code for code, _ in results.values())


if __name__ == "__main__":
    sys.exit(main())
