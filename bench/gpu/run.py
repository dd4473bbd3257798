"""lathe on one GPU in one device call: the CUDA tests (tests/gpu) and a short core subset of lathe's tests on the
device's torch, then sft speed and memory on Qwen2.5-0.5B- and 1.5B-shaped models (random weights from a config),
full and LoRA, bf16, SDPA, packed rows: lathe (chunked loss on/off, torch_compile on/off) against
transformers.Trainer on the same model and data, with lathe's memory plan beside each measured peak. Writes
report.json and report.md (and the pytest logs) under $OUT (default bench/gpu/out); exits 1 when a test failed or a
run's checks (falling loss, non-zero gradient norms) did not hold.

The device call (docs/BENCHMARKS_gpu.md; on an H100 it should end within 8 minutes):

    run(command="bash bench/gpu/device.sh", carry=[".whl"], timeout_s=560)

bench/gpu/device.sh installs the carried wheels (bench/gpu/fetch_wheels.sh fetches them into .whl/; none are
required) and runs `python3 bench/gpu/run.py`. Without a GPU, `python bench/gpu/run.py --cpu` runs the same
code end to end with tiny shapes in about a minute (tests/test_gpu_bench.py does, so the script cannot rot).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPOSITORY)]

import report  # noqa: E402  (bench/gpu/report.py, beside this file)
import runs  # noqa: E402

# A short core subset run on the device's torch (2.11 there): the loop, resume and the chunked loss.
CORE_TESTS = ["tests/train/test_trainer_steps.py", "tests/train/test_resume.py", "tests/train/test_chunked_loss.py"]
# Constant rates that make the loss fall within the few steps of a run (the tiny model needs larger ones).
LEARNING_RATES = {False: {"full": 2e-4, "lora": 1e-3}, True: {"full": 3e-3, "lora": 1e-2}}


def plan_runs(cpu: bool, liger: bool) -> list[dict]:
    """Every configuration, cheap ones first: when the time budget runs out, the compiled runs are the ones dropped."""
    if cpu:
        sizes = [("tiny", 2, 64, 2, 4, 2)]
    else:  # shape, rows per batch, tokens per row, warm-up updates, timed updates, logging interval
        sizes = [("qwen2.5-0.5b", 2, 4096, 3, 12, 5), ("qwen2.5-1.5b", 1, 4096, 3, 12, 5)]
    variants = [("hf", {}), ("lathe", {}), ("lathe", {"chunked": True})]
    if liger:
        variants += [("hf", {"liger": True}), ("lathe", {"liger": True})]
    plans = []
    for shape, batch, seq_len, warmup, steps, log_every in sizes:
        for method in ("full", "lora"):
            for runner, options in variants:
                plans.append(dict(shape=shape, method=method, runner=runner, options=options, batch=batch, seq_len=seq_len,
                                  warmup=warmup, steps=steps, log_every=log_every,
                                  learning_rate=LEARNING_RATES[cpu][method]))  # fmt: skip
    compiled = [
        dict(plan, options={"compile": True}) for plan in plans if plan["runner"] == "lathe" and not plan["options"]
    ]
    return plans + compiled[:2]  # torch_compile on the smaller shape only: inductor's compile takes a minute or more


def name_of(plan: dict) -> str:
    flags = "+".join(key for key, on in sorted(plan["options"].items()) if on) or "default"
    return f"{plan['shape']}/{plan['method']}/{plan['runner']}/{flags}"


def run_pytest(name: str, paths: list[str], out: Path, timeout: int, hide_gpu: bool = False) -> dict:
    """pytest in a subprocess; its junit XML gives each test's outcome. hide_gpu: the core tests are CPU tests
    (bitwise comparisons with CPU loops), run on the device's torch with CUDA hidden."""
    xml, log = out / f"{name}.xml", out / f"{name}.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])))
    if hide_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", f"--junitxml={xml}", *paths]
    if hide_gpu and importlib.util.find_spec("xdist") is not None:  # CPU tests: spread over the device's 16 cores
        command[3:3] = ["-n", "8"]
    began = time.perf_counter()
    try:
        completed = subprocess.run(command, cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=timeout)
        log.write_text(completed.stdout + completed.stderr)
        returncode = completed.returncode
    except subprocess.TimeoutExpired as error:
        log.write_text(f"timed out after {timeout} s\n{error.stdout or ''}")
        returncode = "timeout"
    return {"returncode": returncode, "seconds": time.perf_counter() - began, "tests": report.junit_outcomes(xml)}


def environment(cpu: bool) -> dict:
    import platform

    import torch
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    for package in ("peft", "accelerate", "liger_kernel", "bitsandbytes", "triton"):
        try:
            module = __import__(package)
            info[package] = getattr(module, "__version__", "installed")
        except ImportError:
            info[package] = None
    info["cuda"] = torch.version.cuda
    info["device_name"] = None if cpu else torch.cuda.get_device_name(0)
    peak = runs.peak_flops(info["device_name"])
    info["peak_bf16_tflops"] = peak / 1e12 if peak else None
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (no GPU needed)")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "out"), help="report folder ($OUT)")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds after which no further run starts")
    parser.add_argument("--skip-tests", action="store_true", help="no pytest runs (speed and memory only)")
    options = parser.parse_args(argv)
    started = time.perf_counter()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    if not options.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device: use --cpu")
    env = environment(options.cpu)
    results = {"mode": "cpu" if options.cpu else "cuda", "environment": env, "mfu_formula": runs.MFU_FORMULA}
    if not options.skip_tests:
        results["gpu_tests"] = run_pytest("pytest_gpu", ["tests/gpu"], out, timeout=240)
        results["core_tests"] = (
            run_pytest("pytest_core", CORE_TESTS, out, timeout=120, hide_gpu=True) if not options.cpu else None
        )
    plans = plan_runs(options.cpu, liger=env["liger_kernel"] is not None and not options.cpu)
    results["runs"] = []
    for plan in plans:
        spec = dict(plan, name=name_of(plan), device="cpu" if options.cpu else "cuda", half=not options.cpu,
                    seed=0, device_name=env["device_name"])  # fmt: skip
        if time.perf_counter() - started > options.budget:
            results["runs"].append({**plan, "name": spec["name"], "ok": None, "skipped": "time budget"})
            continue
        with tempfile.TemporaryDirectory() as output_dir:
            result = runs.run(spec, output_dir)
        print(report.one_line(result), flush=True)
        results["runs"].append(result)
    results["not_run"] = report.NOT_RUN
    results["seconds"] = time.perf_counter() - started
    results["ok"] = report.all_ok(results)
    (out / "report.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(report.markdown(results))
    print(report.markdown(results))
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
