"""Turns a run_all.py results JSON into the markdown report (docs/BENCHMARKS.md).

python bench/report.py bench/results/run-YYYYmmdd-HHMMSS.json [> docs/BENCHMARKS.md]
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

NAMES = {"plain": "plain PyTorch loop", "hf": "transformers.Trainer", "lathe": "lathe.Trainer"}
NAN = float("nan")


def median(values):
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(values) if values else NAN


def fmt(value, digits=2, unit=""):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}{unit}"


def ratio(numerator, denominator):
    if any(v is None or math.isnan(v) for v in (numerator, denominator)) or denominator == 0:
        return NAN
    return numerator / denominator


def summarise_runs(runs: list[dict]) -> dict:
    """(job, runner) -> medians of the successful repeats."""
    table = {}
    for job in dict.fromkeys(r["job"] for r in runs):
        for runner in dict.fromkeys(r["runner"] for r in runs):
            records = [r for r in runs if r["job"] == job and r["runner"] == runner]
            good = [r for r in records if r["rc"] == 0]
            results = [r["result"] for r in good]
            if not records:
                continue
            entry = {
                "runs": len(records),
                "ok": len(good),
                "errors": [r["error"] for r in records if r["rc"]],
                "commands": [r["command"] for r in records],
            }
            if results:
                train = [r["train_s"] for r in results]
                entry.update(
                    train_by_repeat={r["repeat"]: r["result"]["train_s"] for r in good},
                    train_s=median(train),
                    train_min=min(train),
                    train_max=max(train),
                    train_cpu_s=median([r.get("train_cpu_s") for r in results]),
                    wall_s=median([r["wall_s"] for r in good]),
                    first_step_s=median([r["first_step_s"] for r in results]),
                    maxrss_mb=median([r["maxrss_mb"] for r in good]),
                    import_s=median([r["import_s"] for r in results]),
                    steps=results[0]["global_step"],
                    final_losses=[r["final_loss"] for r in results],
                    train_losses=[r["train_loss"] for r in results],
                    checksums=[r["param_checksum"] for r in results],
                    train_tokens=results[0].get("train_tokens"),
                    eval_losses=[e["eval_loss"] for e in results[0]["log_history"] if "eval_loss" in e],
                )
                entry["steps_per_s"] = entry["steps"] / entry["train_s"]
                if entry["train_tokens"]:
                    entry["tokens_per_s"] = entry["train_tokens"] / entry["train_s"]
            table[(job, runner)] = entry
    return table


def training_section(results: dict, table: dict) -> list[str]:
    lines = []
    jobs = list(dict.fromkeys(job for job, _ in table))
    for job in jobs:
        runners = [r for r in results["runners"] if (job, r) in table]
        any_entry = next((table[(job, r)] for r in runners if table[(job, r)]["ok"]), None)
        lines += [f"### Job `{job}`", ""]
        lines += [
            "| runner | train time, median (min–max) | train CPU time | steps/s | tokens/s | process wall "
            "| start → 1st step | peak RSS | final loss |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for runner in runners:
            e = table[(job, runner)]
            if not e["ok"]:
                lines.append(f"| {NAMES[runner]} | failed ({e['runs']} of {e['runs']} runs) | | | | | | | |")
                continue
            lines.append(
                f"| {NAMES[runner]} | {fmt(e['train_s'])} s ({fmt(e['train_min'])}–{fmt(e['train_max'])}) "
                f"| {fmt(e['train_cpu_s'])} s | {fmt(e['steps_per_s'], 1)} | {fmt(e.get('tokens_per_s'), 0)} "
                f"| {fmt(e['wall_s'])} s | {fmt(e['first_step_s'])} s | {fmt(e['maxrss_mb'], 0)} MB "
                f"| {e['final_losses'][0]:.6f} |"
            )
        if any_entry is None:
            lines += ["Every run of this job failed; see Failures.", ""]
            continue
        lines += [
            "",
            f"{any_entry['steps']} optimizer steps per run; {any_entry['ok']} repeat(s) per runner "
            "(medians shown)."
            + (
                f" Tokens/s counts the {any_entry['train_tokens']:,} non-padding training tokens."
                if any_entry.get("train_tokens")
                else ""
            ),
            "",
        ]
        pairs = [("lathe", "plain"), ("lathe", "hf"), ("hf", "plain")]
        lines += [
            "| ratio (lower is faster for the first) | train wall | train wall, paired | train CPU | process wall "
            "| start → 1st step | train wall difference per step |",
            "|---|---|---|---|---|---|---|",
        ]
        for a, b in pairs:
            if (job, a) not in table or (job, b) not in table or not table[(job, a)]["ok"] or not table[(job, b)]["ok"]:
                continue
            ea, eb = table[(job, a)], table[(job, b)]
            lines.append(
                f"| {NAMES[a]} / {NAMES[b]} | {fmt(ratio(ea['train_s'], eb['train_s']), 3)}× "
                f"| {fmt(paired_ratio(ea, eb), 3)}× | {fmt(ratio(ea['train_cpu_s'], eb['train_cpu_s']), 3)}× | {fmt(ratio(ea['wall_s'], eb['wall_s']), 3)}× "
                f"| {fmt(ratio(ea['first_step_s'], eb['first_step_s']), 3)}× "
                f"| {fmt(1e6 * (ea['train_s'] - eb['train_s']) / ea['steps'], 0)} µs |"
            )
        lines += [
            "",
            "*Paired*: the median over repeats of the ratio within one round (the two runs ran back to "
            "back, so they saw similar machine load).",
            "",
        ]
    return lines


def paired_ratio(a: dict, b: dict) -> float:
    common = sorted(set(a["train_by_repeat"]) & set(b["train_by_repeat"]))
    return median([a["train_by_repeat"][k] / b["train_by_repeat"][k] for k in common])


def agreement_section(results: dict, table: dict) -> list[str]:
    lines = [
        "## Same maths: losses agree",
        "",
        "Final loss = the trained model's loss on fixed data computed by the same function in every runner "
        "(regression: full-data MSE; lm: held-out eval loss). Weight checksum = sum of all weights in "
        "float64. Equal numbers mean every optimizer step did the same arithmetic.",
        "",
        "| job | runner | final loss | train loss (Trainer's mean) | weight checksum | eval losses during training "
        "| identical to plain loop |",
        "|---|---|---|---|---|---|---|",
    ]
    for (job, runner), e in table.items():
        if not e["ok"]:
            continue
        plain = table.get((job, "plain"))
        same = "—"
        if plain and plain["ok"] and runner != "plain":
            deltas = [
                abs(e["final_losses"][0] - plain["final_losses"][0]),
                abs(e["checksums"][0] - plain["checksums"][0]),
            ]
            same = "bit-identical" if max(deltas) == 0 else f"max abs diff {max(deltas):.2e}"
        repeat_note = "" if len(set(e["final_losses"])) == 1 else " (repeats differ!)"
        eval_losses = ", ".join(f"{v:.4f}" for v in e["eval_losses"]) or "—"
        lines.append(
            f"| {job} | {NAMES[runner]} | {e['final_losses'][0]:.8f}{repeat_note} | {e['train_losses'][0]:.8f} "
            f"| {e['checksums'][0]:.10f} | {eval_losses} | {same} |"
        )
    return lines + [""]


def import_section(results: dict) -> tuple[list[str], dict]:
    imports = results.get("imports") or {}
    lines = [
        "## Import time",
        "",
        "Each statement in a fresh process (one warm-up round discarded). *In-process* times the statement "
        "alone (after the untimed part before `; then`); *process wall* adds interpreter start-up and exit.",
        "",
        "| statement | in-process, median | in-process CPU, median | process wall, median | peak RSS |",
        "|---|---|---|---|---|",
    ]
    medians = {}
    for label, samples in imports.items():
        good = [s for s in samples if "error" not in s]
        if not good:
            if samples:
                lines.append(f"| `{label}` | failed | | |")
            continue
        medians[label] = median([s["in_process_s"] for s in good])
        medians[label + " (cpu)"] = median([s.get("in_process_cpu_s") for s in good])
        lines.append(
            f"| `{label}` | {fmt(medians[label], 3)} s | {fmt(medians[label + ' (cpu)'], 3)} s "
            f"| {fmt(median([s['wall_s'] for s in good]), 3)} s "
            f"| {fmt(median([s['maxrss_mb'] for s in good]), 0)} MB |"
        )
    return lines + [""], medians


def cli_section(results: dict) -> tuple[list[str], float]:
    cli = results.get("cli") or {}
    lines = ["## `lathe --help`", ""]
    best = NAN
    if not cli:
        return lines + ["Not measured (lathe not importable in this run).", ""], best
    lines += ["| command | process wall, median |", "|---|---|"]
    for label, entry in cli.items():
        if entry["available"]:
            value = median(entry["wall_s"])
            best = value if math.isnan(best) else min(best, value)
            lines.append(f"| `{label}` | {fmt(value, 3)} s |")
        else:
            last = entry["error"].strip().splitlines()[-1] if entry["error"].strip() else "non-zero exit"
            lines.append(f"| `{label}` | not available: `{last[:120]}` |")
    return lines + [""], best


def evalmem_section(results: dict) -> tuple[list[str], dict]:
    records = results.get("evalmem") or []
    lines = [
        "## Evaluation memory (lm job, `evaluate()` on 1× and 10× the eval texts)",
        "",
        "The process builds everything, then resets the kernel's RSS high-water mark "
        "(`/proc/self/clear_refs`) and calls `evaluate()` once: *peak* is the high-water mark during "
        "`evaluate()`, *growth* is peak minus the RSS just before it. `accuracy` adds "
        "`compute_metrics` with `preprocess_logits_for_metrics=argmax` (predictions are kept for the "
        "metric); `loss` keeps nothing. The plain loop's row is `jobs.lm_eval_loss`.",
        "",
        "| runner | metrics | peak 1× | peak 10× | peak ratio 10×/1× | growth 1× | growth 10× | eval time 1× / 10× |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    keys = list(dict.fromkeys((r["runner"], r["eval_metrics"]) for r in records))
    for runner, metrics in keys:
        by_scale = {r["eval_scale"]: r for r in records if (r["runner"], r["eval_metrics"]) == (runner, metrics)}
        if any(by_scale.get(s, {}).get("rc", 1) for s in (1, 10)):
            failed = next(r for r in by_scale.values() if r["rc"])
            last = failed["error"].strip().splitlines()[-1] if failed.get("error") else "?"
            lines.append(f"| {NAMES[runner]} | {metrics} | failed: `{last[:150]}` | | | | | |")
            continue
        one, ten = by_scale[1]["result"], by_scale[10]["result"]
        ratios[(runner, metrics)] = ten["eval_peak_rss_mb"] / one["eval_peak_rss_mb"]
        lines.append(
            f"| {NAMES[runner]} | {metrics} | {fmt(one['eval_peak_rss_mb'], 0)} MB | {fmt(ten['eval_peak_rss_mb'], 0)} MB "
            f"| {fmt(ratios[(runner, metrics)], 3)}× | {fmt(one['eval_peak_rss_mb'] - one['rss_before_eval_mb'], 1)} MB "
            f"| {fmt(ten['eval_peak_rss_mb'] - ten['rss_before_eval_mb'], 1)} MB "
            f"| {fmt(one['eval_s'])} s / {fmt(ten['eval_s'])} s |"
        )
    if records:
        samples = {r["eval_scale"]: r["result"]["eval_samples"] for r in records if r["rc"] == 0}
        lines += ["", f"Eval texts: {samples.get(1, '?')} (1×) and {samples.get(10, '?')} (10×)."]
    return lines + [""], ratios


def targets_section(table, import_medians, cli_best, eval_ratios, lathe_available) -> list[str]:
    def train(job, runner, key="train_s"):
        entry = table.get((job, runner))
        return entry[key] if entry and entry["ok"] else NAN

    rows = []

    def add(target, measured_wall, measured_cpu, limit, higher_is_better=False, unit="×"):
        def verdict(value):
            if math.isnan(value):
                return "pending"
            return "met" if (value >= limit if higher_is_better else value <= limit) else "**missed**"

        cpu_text = f"{fmt(measured_cpu, 3)}{unit} ({verdict(measured_cpu)})" if measured_cpu is not None else "—"
        rows.append(f"| {target} | {fmt(measured_wall, 3)}{unit} | {verdict(measured_wall)} | {cpu_text} |")

    add(
        "lm: lathe train time ≤ 1.05× plain loop",
        ratio(train("lm", "lathe"), train("lm", "plain")),
        ratio(train("lm", "lathe", "train_cpu_s"), train("lm", "plain", "train_cpu_s")),
        1.05,
    )
    add(
        "regression: lathe train time ≤ 1.15× plain loop",
        ratio(train("regression", "lathe"), train("regression", "plain")),
        ratio(train("regression", "lathe", "train_cpu_s"), train("regression", "plain", "train_cpu_s")),
        1.15,
    )
    add(
        "regression: lathe ≥ 1.5× faster than transformers.Trainer (speed-up shown)",
        ratio(train("regression", "hf"), train("regression", "lathe")),
        ratio(train("regression", "hf", "train_cpu_s"), train("regression", "lathe", "train_cpu_s")),
        1.5,
        True,
    )
    add(
        "lm: lathe never slower than transformers.Trainer (lathe / HF time)",
        ratio(train("lm", "lathe"), train("lm", "hf")),
        ratio(train("lm", "lathe", "train_cpu_s"), train("lm", "hf", "train_cpu_s")),
        1.0,
    )
    after_torch = "import torch; then from lathe import Trainer, TrainingArguments"
    add(
        "`from lathe import Trainer, TrainingArguments` adds ≤ 0.3 s to `import torch`",
        import_medians.get(after_torch, NAN),
        import_medians.get(after_torch + " (cpu)", NAN),
        0.3,
        unit=" s",
    )
    add("`lathe --help` ≤ 1 s (process wall)", cli_best, None, 1.0, unit=" s")
    for metrics in ("loss", "accuracy"):
        add(
            f"eval memory flat, `{metrics}`: peak RSS at 10× data ≤ 1.1× peak at 1×",
            eval_ratios.get(("lathe", metrics), NAN),
            None,
            1.1,
        )
    header = [
        "## Targets for lathe",
        "",
        "Judged on the medians below (train time of the `train()` call). CPU time = process CPU seconds of "
        "the same phase (one thread): it leaves out time spent waiting for a core, not the slow-down from "
        "work on the other core, so on a shared machine it is a second opinion, not a cure."
        + ("" if lathe_available else " **lathe was not importable in this run: its numbers are pending.**"),
        "",
        "| target | measured (wall) | verdict | measured (CPU time) |",
        "|---|---|---|---|",
    ]
    return header + rows + [""]


def profile_section(results: dict) -> list[str]:
    profiles = [p for p in results.get("profiles", []) if "top" in p]
    if not profiles:
        return []
    lines = [
        "## Where the time goes (cProfile, regression job)",
        "",
        "One extra run per runner with cProfile around the training call (profiling inflates Python-heavy "
        "code, so read these as shares, not times). Own time (`tottime`) summed by where the code lives:",
        "",
    ]
    packages = sorted({k for p in profiles for k in p["packages"]})
    lines += ["| runner | total | " + " | ".join(packages) + " |", "|---|---|" + "---|" * len(packages)]
    for p in profiles:
        cells = [f"{1e6 * p['packages'].get(k, 0.0) / p['steps']:,.0f}" for k in packages]
        lines.append(f"| {NAMES[p['runner']]} | {1e6 * p['total_s'] / p['steps']:,.0f} | " + " | ".join(cells) + " |")
    lines += ["", "(µs per optimizer step.)", ""]
    for p in profiles:
        if p["runner"] != "lathe":
            continue
        lines += [
            f"Top functions by own time in {NAMES[p['runner']]}'s `train()`:",
            "",
            "| function | calls | own µs/step | cumulative µs/step |",
            "|---|---|---|---|",
        ]
        for row in p["top"]:
            lines.append(
                f"| `{row['function']}` | {row['ncalls']:,} | {1e6 * row['tottime'] / p['steps']:,.1f} "
                f"| {1e6 * row['cumtime'] / p['steps']:,.1f} |"
            )
        lines.append("")
    return lines


def render(results: dict, results_path=None) -> str:
    meta = results["meta"]
    table = summarise_runs(results["runs"])
    versions = meta["versions"]
    version_text = ", ".join(f"{k} {v}" for k, v in versions.items()) if isinstance(versions, dict) else versions
    lines = [
        "# Benchmarks: plain PyTorch loop vs transformers.Trainer vs lathe.Trainer",
        "",
        f"Generated by `bench/run_all.py` on {meta['started']} (UTC); see `bench/README.md` to reproduce.",
        "",
        f"- Command: `{meta['command']}` ({fmt(meta.get('duration_s', NAN) / 60, 1)} min)",
        f"- Machine: {meta['cpu']}, {meta['cores']} cores (shared with other work), {meta['memory_gib']} GiB RAM, "
        f"no GPU; {meta['os']}",
        f"- Load average at start / end: {', '.join(f'{v:.1f}' for v in meta['load_average_start'])} / "
        f"{', '.join(f'{v:.1f}' for v in meta.get('load_average_end', []))}",
        f"- {meta['python']}; {version_text}; lathe at commit {meta['lathe_commit']}",
        "- Threads: `OMP_NUM_THREADS=1` and `torch.set_num_threads(1)` in every process; every number is from "
        "a fresh subprocess; runners interleaved (plain, HF, lathe, plain, ...)"
        + (
            f"; children ran at nice {meta['nice']} to get a whole core on the shared machine."
            if meta.get("nice")
            else "."
        ),
        f"- Raw results: `{meta.get('results_file', results_path)}` (git-ignored)",
        "",
    ]
    if not results["lathe"]["available"]:
        lines += [
            "**lathe's column is pending**: `from lathe import Trainer, TrainingArguments` failed:",
            "",
            "```",
            results["lathe"]["error"].strip()[-1500:],
            "```",
            "",
        ]
    import_lines, import_medians = import_section(results)
    cli_lines, cli_best = cli_section(results)
    eval_lines, eval_ratios = evalmem_section(results)
    lines += targets_section(table, import_medians, cli_best, eval_ratios, results["lathe"]["available"])
    lines += [
        "## Training",
        "",
        "*Train time* is the `trainer.train()` call (the plain loop: its whole loop, optimizer creation "
        "included); it covers evaluation and checkpointing in the lm job. *Process wall* is spawn to exit "
        "(imports, data, model, training). *Start → 1st step* is spawn to the first `on_step_end` "
        "(plain loop: after its first `optimizer.step()`). *Peak RSS* is the child's `ru_maxrss`.",
        "",
    ]
    lines += training_section(results, table)
    lines += agreement_section(results, table)
    lines += profile_section(results)
    lines += import_lines + cli_lines + eval_lines
    failures = [(k, e) for k, e in table.items() if e["errors"]]
    if failures:
        lines += ["## Failures", ""]
        for (job, runner), e in failures:
            lines += [
                f"{NAMES[runner]} on `{job}` failed {len(e['errors'])} of {e['runs']} runs. Reproduce with "
                f"`{e['commands'][0]}`:",
                "",
                "```",
                e["errors"][0].strip()[-2000:],
                "```",
                "",
            ]
    lines += [
        "## How the jobs are made equal",
        "",
        "- `bench/jobs.py` holds data, models and hyperparameters; the Trainer runner (`bench/run_trainer.py`) "
        "is one file for both trainers, differing only in the import line.",
        "- Weights: `torch.manual_seed(seed)` right before building the model, in every process.",
        "- Sample order: transformers.Trainer shuffles epoch *e* with `torch.randperm` from a generator seeded "
        "`seed + e` (accelerate's `SeedableRandomSampler`); the plain loop draws the same permutation "
        "(`jobs.epoch_order`).",
        '- Optimizer: `optim="adamw_torch"` = `torch.optim.AdamW` (foreach default), weight decay 0, linear '
        "schedule (lm: 16 warm-up steps), `max_grad_norm=1.0`; the plain loop builds the same objects and clips "
        "the same way.",
        "- lm loss: tokens are summed and divided by the label tokens of the whole accumulated step "
        "(`num_items_in_batch`), as transformers does for models that accept it; padding is labelled -100.",
        "- The plain loop is the floor: it gathers regression batches from the data tensors with one index "
        "operation (no per-sample `__getitem__`, no collator, no DataLoader) and does only the work the job "
        "needs (log every `logging_steps`, the same evaluations and checkpoints: safetensors weights, "
        "optimizer, scheduler, RNG state).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(sys.argv[1])
    print(render(json.loads(path.read_text()), path))
