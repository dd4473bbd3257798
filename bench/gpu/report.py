"""bench/gpu/run.py's results as Markdown: the environment, the test outcomes, one table row per run (tokens/s,
MFU, peak memory beside the memory plan, the checks), and what was not run and why."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

MIB = 2**20

# Peers the brief asked for that this script does not run, and why (docs/BENCHMARKS_gpu.md says more).
NOT_RUN = {
    "LLaMA-Factory": "not carried: llamafactory 0.9.5 pins transformers<=5.6, accelerate<=1.11, datasets<=4.0, trl<=0.24 "
    "and gradio; its own stack exceeds the 64 MiB carry budget and would not share the other runs' transformers "
    "(bench/gpu/WHEELS.md)",
    "Liger-Kernel": "the use_liger_kernel runs (hf and lathe) happen only when the liger_kernel wheel is carried in .whl/",
    "QLoRA": "tests/gpu's 4-bit test is skipped unless the bitsandbytes wheel is carried in .whl/",
}


def junit_outcomes(xml: Path) -> dict:
    """{test id: passed | failed | error | skipped} from pytest's junit XML ({} when there is none)."""
    if not xml.exists():
        return {}
    outcomes = {}
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[name] = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
    return outcomes


def all_ok(results: dict) -> bool:
    for key in ("gpu_tests", "core_tests"):
        tests = results.get(key)
        if tests and (
            tests["returncode"] not in (0, 5) or any(v in ("failed", "error") for v in tests["tests"].values())
        ):
            return False
    return all(run["ok"] is not False for run in results["runs"])


def _mib(value) -> str:
    return f"{value / MIB:,.0f}" if value else "n/a"


def one_line(run: dict) -> str:
    if not run.get("ok") and "error" in run:
        return f"{run['name']}: ERROR {run['error']}"
    mfu = f"{100 * run['mfu']:.1f}%" if run.get("mfu") else "n/a"
    return f"{run['name']}: {run['tokens_per_second']:,.0f} tok/s, MFU {mfu}, peak {_mib(run.get('peak_allocated_bytes'))} MiB, checks {run['checks']}"


def _tests_section(title: str, tests: dict | None) -> list[str]:
    if not tests:
        return [f"## {title}", "", "not run", ""]
    counts = {}
    for outcome in tests["tests"].values():
        counts[outcome] = counts.get(outcome, 0) + 1
    lines = [f"## {title}", "", f"pytest exit {tests['returncode']} in {tests['seconds']:.0f} s: {counts}", ""]
    lines += [f"- {outcome}: `{name}`" for name, outcome in sorted(tests["tests"].items()) if outcome != "passed"]
    return lines + [""]


def markdown(results: dict) -> str:
    env = results["environment"]
    label = (
        "CPU, tiny shapes (a check that the script runs, not a benchmark)"
        if results["mode"] == "cpu"
        else env["device_name"]
    )
    lines = [f"# lathe on one GPU: {label}", ""]
    lines += [", ".join(f"{key} {value}" for key, value in env.items()), ""]
    lines += [f"`{results['mfu_formula']}`; peak {env['peak_bf16_tflops']} TFLOP/s dense bf16.", ""]
    lines += _tests_section("CUDA tests (tests/gpu)", results.get("gpu_tests"))
    lines += _tests_section("Core tests on this torch (CUDA hidden)", results.get("core_tests"))
    lines += ["## Speed and memory", ""]
    lines += ["| run | rows x tokens | tokens/s | MFU | peak allocated MiB | plan MiB | losses (logged) | checks |"]
    lines += ["|---|---|---:|---:|---:|---:|---|---|"]
    for run in results["runs"]:
        size = f"{run['batch']} x {run['seq_len']}"
        if run.get("skipped") or "error" in run:
            lines.append(f"| {run['name']} | {size} | | | | | {run.get('skipped') or run['error'][:120]} | |")
            continue
        mfu = f"{100 * run['mfu']:.1f}%" if run.get("mfu") else "n/a"
        losses = " → ".join(f"{loss:.3f}" for loss in run["losses"])
        checks = "ok" if run["ok"] else f"FAILED {run['checks']}"
        lines.append(
            f"| {run['name']} | {size} | {run['tokens_per_second']:,.0f} | {mfu} | {_mib(run.get('peak_allocated_bytes'))} "
            f"| {_mib(run.get('plan_peak_bytes'))} | {losses} | {checks} |"
        )
    lines += ["", "## Not run", ""] + [f"- {name}: {why}" for name, why in results["not_run"].items()]
    lines += ["", f"Total {results['seconds']:.0f} s; all checks held: {results['ok']}.", ""]
    return "\n".join(lines)
