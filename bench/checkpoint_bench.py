"""Checkpoint benchmark: save time and time to the first step after a resume, lathe.Trainer vs
transformers.Trainer, on the lm job of bench/jobs.py.

    python bench/checkpoint_bench.py            # ~10 min -> docs/BENCHMARKS_checkpoints.md
    python bench/checkpoint_bench.py --quick    # smoke run on the quick lm job -> bench/results/
    python bench/checkpoint_bench.py --render bench/results/checkpoints-<stamp>.json   # report only

Every number comes from a fresh subprocess of bench/.venv-peers/bin/python (`--python`) with
OMP_NUM_THREADS=1; the implementations take turns within each repeat. Workers (run by the above):

    --worker prepare --impl X                 train 90% into epoch 1, save that checkpoint (untimed)
    --worker save --impl X [--no-fsync]       train 1 step, then time `_save_checkpoint` --saves times
    --worker resume --impl X --mode fresh|resume --dataset fast|slow
                                              time train() from the call to the first on_step_end

What is timed:
- save: `trainer._save_checkpoint(model, None)`, the method both trainers call at a save step:
  weights (safetensors), optimizer, scheduler, RNG, trainer state, training arguments, rotation.
  That call is what the training loop waits for. In a single process lathe copies the state
  there (a memcpy) and writes the files from the copy, fsyncs every file and renames a staging
  folder in a background thread that overlaps the next steps; *published* adds the wait for that
  thread (the checkpoint is then on disk and visible). transformers writes in place in the loop and
  does not fsync. `lathe-nofsync` (fsync patched out) shows what the durability costs.
- resume: the `train()` call up to the first optimizer step's on_step_end, for a fresh run and for
  a run resumed from a checkpoint 90% into the first epoch (RESUME_FRACTION), where the data
  loader must skip most of the epoch's batches. The `slow` dataset sleeps 1 ms in every __getitem__ and counts the
  calls, so any skipped sample that gets loaded shows up both as time and as a count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPOSITORY = BENCH_DIR.parent
WORK_DIR = BENCH_DIR / "results" / "checkpoint-bench-work"  # not results/tmp: run_all.py wipes that
DEFAULT_PYTHON = BENCH_DIR / ".venv-peers" / "bin" / "python"
RESUME_FRACTION = 0.9  # resume from a checkpoint this far into the first epoch: most of it to skip
SLOW_ITEM_S = 0.001


# ---------------------------------------------------------------------------------------------
# Worker side (runs in the peers' virtual environment)
# ---------------------------------------------------------------------------------------------
def _trainer_classes(impl: str):
    if impl == "hf":
        from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments
    else:
        from lathe import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments
    return DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments


def _build(impl: str, job, output_dir: str, dataset_kind: str = "fast", callbacks=(), **overrides):
    """The lm job's Trainer, with the arguments of run_trainer.py (no evaluation: not timed here)."""
    import jobs

    collator_class, trainer_class, _callback, arguments_class = _trainer_classes(impl)
    data = jobs.load_lm_data(job)
    model = jobs.build_lm_model(job, data["vocab_size"])
    train_dataset = (SlowDataset if dataset_kind == "slow" else jobs.DictDataset)({"input_ids": data["train"]})
    options = dict(
        output_dir=output_dir,
        per_device_train_batch_size=job.batch_size,
        gradient_accumulation_steps=job.gradient_accumulation_steps,
        num_train_epochs=job.epochs,
        learning_rate=job.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=job.warmup_steps,
        weight_decay=0.0,
        max_grad_norm=job.max_grad_norm,
        optim="adamw_torch",
        logging_steps=job.logging_steps,
        eval_strategy="no",
        save_strategy="no",
        seed=job.seed,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    options.update(overrides)
    trainer = trainer_class(
        model=model,
        args=arguments_class(**options),
        train_dataset=train_dataset,
        data_collator=collator_class(tokenizer=jobs.lm_tokenizer(data), mlm=False),
        callbacks=list(callbacks),
    )
    return trainer, train_dataset


def _import_jobs():
    sys.path.insert(0, str(BENCH_DIR))
    import jobs

    return jobs


class SlowDataset:
    """jobs.DictDataset whose __getitem__ takes SLOW_ITEM_S (decoding, augmentation, remote reads)."""

    def __init__(self, columns: dict):
        import jobs

        self.inner = jobs.DictDataset(columns)
        self.fetched = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> dict:
        self.fetched += 1
        time.sleep(SLOW_ITEM_S)
        return self.inner[index]


def _versions() -> dict:
    import accelerate
    import safetensors
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "safetensors": safetensors.__version__,
    }


def _folder_size(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def resume_step(job) -> int:
    return int(job.steps_per_epoch * RESUME_FRACTION)


def worker_prepare(impl: str, job) -> dict:
    _, _, callback_class, _ = _trainer_classes(impl)
    step = resume_step(job)

    class StopAt(callback_class):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= step:
                control.should_save = True
                control.should_training_stop = True

    output_dir = WORK_DIR / f"resume-from-{impl}"
    shutil.rmtree(output_dir, ignore_errors=True)
    trainer, _ = _build(impl, job, str(output_dir), callbacks=[StopAt()])
    trainer.train()
    return {"checkpoint": str(output_dir / f"checkpoint-{step}"), "step": step, "steps_per_epoch": job.steps_per_epoch}


def worker_save(impl: str, job, saves: int, fsync: bool) -> dict:
    import torch

    if impl == "lathe" and not fsync:
        from lathe.train.checkpoints import layout as ckpt

        ckpt._fsync_tree = ckpt._fsync_dir = lambda folder: None
    output_dir = WORK_DIR / f"save-{impl}{'' if fsync else '-nofsync'}"
    shutil.rmtree(output_dir, ignore_errors=True)
    trainer, _ = _build(impl, job, str(output_dir), max_steps=1)
    trainer.train()  # one step: the optimizer has its moment estimates, as at any real save
    times, durable, size, files = [], [], 0, 0
    commits = getattr(trainer, "_checkpoint_commits", None)  # lathe: flush + rename in a background thread
    for _ in range(saves):
        start = time.perf_counter()
        trainer._save_checkpoint(trainer.model, None)
        times.append(time.perf_counter() - start)  # what the training loop waits for
        if commits is not None:
            commits.wait()
        durable.append(time.perf_counter() - start)  # until published (lathe: flushed to disk and renamed)
        folder = output_dir / f"checkpoint-{trainer.state.global_step}"
        size, files = _folder_size(folder)
        shutil.rmtree(folder)  # every save writes a new folder, as in training
    shutil.rmtree(output_dir, ignore_errors=True)
    return {
        "save_s": times,
        "published_s": durable,
        "checkpoint_bytes": size,
        "checkpoint_files": files,
        "threads": torch.get_num_threads(),
    }


def worker_resume(impl: str, job, mode: str, dataset_kind: str, checkpoint: str | None) -> dict:
    _, _, callback_class, _ = _trainer_classes(impl)
    marks = {}

    class FirstStep(callback_class):
        def on_train_begin(self, args, state, control, **kwargs):
            marks.setdefault("train_begin", time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            if "first_step" not in marks:
                marks["first_step"] = time.perf_counter()
                marks["fetched"] = getattr(dataset, "fetched", None)
                marks["global_step"] = state.global_step
            control.should_training_stop = True

    output_dir = WORK_DIR / f"run-{impl}-{mode}-{dataset_kind}"
    shutil.rmtree(output_dir, ignore_errors=True)
    trainer, dataset = _build(impl, job, str(output_dir), dataset_kind, callbacks=[FirstStep()])
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint if mode == "resume" else None)
    shutil.rmtree(output_dir, ignore_errors=True)
    return {
        "first_step_s": marks["first_step"] - start,
        "train_begin_s": marks["train_begin"] - start,
        "items_fetched": marks["fetched"],
        "first_step_number": marks["global_step"],
    }


def worker_main(args) -> None:
    jobs = _import_jobs()
    jobs.prepare_process(threads=1)
    job = jobs.get_job("lm", args.quick)
    if args.worker == "prepare":
        result = worker_prepare(args.impl, job)
    elif args.worker == "save":
        result = worker_save(args.impl, job, args.saves, fsync=not args.no_fsync)
    else:
        result = worker_resume(args.impl, job, args.mode, args.dataset, args.checkpoint)
    result["versions"] = _versions()
    Path(args.out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# Orchestrator (standard library only)
# ---------------------------------------------------------------------------------------------
def _run_worker(python: str, *worker_args: str) -> dict:
    out = WORK_DIR / "worker-result.json"
    out.unlink(missing_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPOSITORY),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    completed = subprocess.run(
        [python, str(Path(__file__).resolve()), *worker_args, "--out", str(out)],
        env=env,
        cwd=str(REPOSITORY),
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"worker {' '.join(worker_args)} failed:\n{completed.stderr[-3000:]}")
    return json.loads(out.read_text())


def _load_average() -> str:
    try:
        return ", ".join(f"{value:.1f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def orchestrate(args) -> None:
    python = args.python or (str(DEFAULT_PYTHON) if DEFAULT_PYTHON.exists() else sys.executable)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    quick = ["--quick"] if args.quick else []
    started, load_start = time.time(), _load_average()
    results = {
        "meta": {
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "python_path": python,
            "command": " ".join(["python", "bench/checkpoint_bench.py", *sys.argv[1:]]),
            "quick": args.quick,
            "repeats": args.repeats,
            "saves": args.saves,
            "commit": _git_commit(),
            "load_start": load_start,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        }
    }
    subprocess.run(
        [python, str(BENCH_DIR / "jobs.py"), "prepare"],
        cwd=REPOSITORY,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )
    impls = ("hf", "lathe")
    if "save" not in args.skip:
        save_runs = {"hf": [], "lathe": [], "lathe-nofsync": []}
        for repeat in range(args.repeats):
            for name in save_runs:
                impl, extra = ("lathe", ["--no-fsync"]) if name == "lathe-nofsync" else (name, [])
                result = _run_worker(
                    python, "--worker", "save", "--impl", impl, "--saves", str(args.saves), *extra, *quick
                )
                save_runs[name].append(result)
                results["meta"]["versions"] = result["versions"]
                print(
                    f"save {name} repeat {repeat}: {', '.join(f'{t * 1000:.0f}' for t in result['save_s'])} ms",
                    flush=True,
                )
        results["save"] = save_runs
    if "resume" not in args.skip:
        prepared = {impl: _run_worker(python, "--worker", "prepare", "--impl", impl, *quick) for impl in impls}
        checkpoints = {impl: result["checkpoint"] for impl, result in prepared.items()}
        results["meta"]["resume_step"] = prepared["lathe"]["step"]
        results["meta"]["steps_per_epoch"] = prepared["lathe"]["steps_per_epoch"]
        resume_runs = []
        for repeat in range(args.repeats):
            for dataset in ("fast", "slow"):
                for mode in ("fresh", "resume"):
                    for impl in impls:
                        result = _run_worker(
                            python,
                            "--worker",
                            "resume",
                            "--impl",
                            impl,
                            "--mode",
                            mode,
                            "--dataset",
                            dataset,
                            "--checkpoint",
                            checkpoints[impl],
                            *quick,
                        )
                        result.update(impl=impl, mode=mode, dataset=dataset, repeat=repeat)
                        resume_runs.append(result)
                        results["meta"]["versions"] = result["versions"]
                        print(
                            f"resume {dataset} {mode} {impl} repeat {repeat}: {result['first_step_s']:.3f} s "
                            f"(items fetched {result['items_fetched']})",
                            flush=True,
                        )
        results["resume"] = resume_runs
    results["meta"]["minutes"] = (time.time() - started) / 60
    results["meta"]["load_end"] = _load_average()
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    raw = BENCH_DIR / "results" / f"checkpoints-{stamp}{'-quick' if args.quick else ''}.json"
    raw.write_text(json.dumps(results, indent=1))
    report = args.report or (
        str(BENCH_DIR / "results" / "BENCHMARKS_checkpoints-quick.md")
        if args.quick
        else str(REPOSITORY / "docs" / "BENCHMARKS_checkpoints.md")
    )
    Path(report).write_text(render(results, raw))
    print(f"raw results: {raw}\nreport: {report}")


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
NAMES = {"hf": "transformers.Trainer", "lathe": "lathe.Trainer", "lathe-nofsync": "lathe.Trainer, fsync patched out"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def render(results: dict, raw: Path) -> str:
    meta = results["meta"]
    versions = meta.get("versions", {})
    header = [
        "# Checkpoint benchmark: save time and resume time, lathe.Trainer vs transformers.Trainer",
        "",
        f"Generated by `bench/checkpoint_bench.py` on {meta['started']} (UTC); see the module docstring to reproduce.",
        "",
        f"- Command: `{meta['command']}` ({meta['minutes']:.1f} min)",
        f"- Machine: {meta['machine']}; shared with other work, load average at start / end: {meta['load_start']} / {meta.get('load_end')}",
        f"- Python {versions.get('python')}; torch {versions.get('torch')}, transformers {versions.get('transformers')}, "
        f"accelerate {versions.get('accelerate')}, safetensors {versions.get('safetensors')}; lathe at commit {meta['commit']}",
        "- Threads: `OMP_NUM_THREADS=1` and `torch.set_num_threads(1)` in every process; each number from a fresh "
        "subprocess; the implementations take turns within each repeat.",
        f"- Job: the lm job of `bench/jobs.py`{' (quick variant)' if meta['quick'] else ''}: a 2-layer Llama, hidden 128, "
        "vocabulary 1024, AdamW, batch 16, gradient accumulation 2.",
        f"- Raw results: `{raw.relative_to(REPOSITORY)}` (git-ignored)",
        "",
    ]
    verdicts, sections = [], []
    if "save" in results:
        sections += _save_section(results["save"], meta, verdicts)
    if "resume" in results:
        sections += _resume_section(results["resume"], meta, verdicts)
    targets = ["## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    targets += [f"| {target} | {measured} | {verdict} |" for target, measured, verdict in verdicts]
    return "\n".join(header + targets + [""] + sections) + "\n"


def _save_section(save_runs: dict, meta: dict, verdicts: list) -> list[str]:
    lines = [
        "## Save time",
        "",
        f"`trainer._save_checkpoint(model, None)` after one training step, {meta['saves']} saves per process "
        f"(each into a new folder), {meta['repeats']} processes per implementation. *First save* is each "
        "process's first (one-time costs included); *later saves* pools the others.",
        "",
        "| implementation | training waits, later saves, median (min–max) | published, later saves, median | "
        "first save, median | checkpoint size | files |",
        "|---|---|---|---|---|---|",
    ]
    medians, published = {}, {}
    for name, runs in save_runs.items():
        later = [t for run in runs for t in run["save_s"][1:]]
        first = [run["save_s"][0] for run in runs]
        medians[name] = statistics.median(later)
        published[name] = statistics.median([t for run in runs for t in run.get("published_s", run["save_s"])[1:]])
        lines.append(
            f"| {NAMES[name]} | {_ms(medians[name])} ({_ms(min(later))}–{_ms(max(later))}) | {_ms(published[name])} | "
            f"{_ms(statistics.median(first))} | {runs[0]['checkpoint_bytes'] / 2**20:.1f} MiB | {runs[0]['checkpoint_files']} |"
        )
    ratio = medians["lathe"] / medians["hf"]
    lines += [
        "",
        f"lathe / transformers, time the training loop waits: {ratio:.2f}×; until the checkpoint is published: "
        f"{published['lathe'] / published['hf']:.2f}× ({published['lathe-nofsync'] / published['hf']:.2f}× with fsync patched out). "
        "The loop waits only while lathe copies the weights, optimizer state and trainer state (lathe/train/checkpoints/snapshot.py); "
        "a background thread writes the files from that copy, then flushes every file, the staging folder and "
        f"output_dir to disk (one `os.fsync` each, {save_runs['lathe'][0]['checkpoint_files'] + 2} for this checkpoint, "
        "the files concurrently) before one rename publishes the checkpoint, as the crash-safety design requires "
        "(the next save, an `on_save` callback and the end of `train()` wait for that thread). The thread's CPU time "
        "is not free: on a machine with no idle core it slows the steps it overlaps, so *published* is the upper "
        "bound of what a save can cost a run. transformers writes into `checkpoint-N/` in place and returns once the data is in the page "
        "cache, so a process killed mid-save leaves a half-written folder, and a power cut can lose the data of a "
        "folder that looks complete. The machine is shared: the min–max ranges show how much other people's work "
        "moved the numbers.",
        "",
    ]
    verdicts.append(
        (
            "lathe save (model + optimizer + state) no slower than transformers' (time the training loop waits)",
            f"{_ms(medians['lathe'])} vs {_ms(medians['hf'])} ({ratio:.2f}×)",
            "met" if ratio <= 1.0 else "**missed**",
        )
    )
    return lines


def _resume_section(runs: list, meta: dict, verdicts: list) -> list[str]:
    skipped = 2 * meta["resume_step"]  # micro-batches: the job accumulates 2 per step
    lines = [
        "## Time to the first step: fresh run vs resumed run",
        "",
        f"From the `train()` call to the first optimizer step's `on_step_end`. *resume* starts from a checkpoint at step "
        f"{meta['resume_step']} of the first epoch's {meta['steps_per_epoch']} (written by the same implementation), so {skipped} batches of 16 "
        f"({skipped * 16} samples) are skipped. *fast*: the job's in-memory dataset; *slow*: the same data with "
        f"{SLOW_ITEM_S * 1000:.0f} ms of sleep in every `__getitem__`. *Items fetched*: `__getitem__` calls before the first "
        f"step ends (the step needs 32, two micro-batches of 16; a loader that reads one batch ahead fetches 48). {meta['repeats']} processes per cell, medians.",
        "",
        "| dataset | implementation | fresh → 1st step | resumed → 1st step | resumed − fresh | items fetched (fresh / resumed) |",
        "|---|---|---|---|---|---|",
    ]
    cell = {}
    for dataset in ("fast", "slow"):
        for impl in ("hf", "lathe"):
            values = {}
            for mode in ("fresh", "resume"):
                chosen = [r for r in runs if r["impl"] == impl and r["mode"] == mode and r["dataset"] == dataset]
                values[mode] = (statistics.median(r["first_step_s"] for r in chosen), chosen[0]["items_fetched"])
            cell[dataset, impl] = values
            fetched = "—" if values["fresh"][1] is None else f"{values['fresh'][1]} / {values['resume'][1]}"
            lines.append(
                f"| {dataset} | {NAMES[impl]} | {_ms(values['fresh'][0])} | {_ms(values['resume'][0])} | "
                f"{_ms(values['resume'][0] - values['fresh'][0])} | {fetched} |"
            )
    lines.append("")
    lathe_slow = cell["slow", "lathe"]
    hf_slow = cell["slow", "hf"]
    loaded_if_iterated = skipped * 16 * SLOW_ITEM_S
    lines += [
        f"Loading the skipped samples would cost at least {loaded_if_iterated:.1f} s on the slow dataset. "
        f"lathe fetched {lathe_slow['resume'][1]} items before its first resumed step, transformers {hf_slow['resume'][1]}: "
        "lathe's ResumableBatchSampler starts the epoch's index list at the resume position, and transformers 5.x "
        "(through accelerate's `skip_first_batches` → `SkipBatchSampler`) also drops the skipped batches as index lists "
        "without fetching them, for map-style datasets. For an `IterableDataset` neither can seek: both read and "
        "discard the skipped samples.",
        "",
    ]
    delta = lathe_slow["resume"][0] - lathe_slow["fresh"][0]
    verdicts.append(
        (
            "lathe resume skips data without loading it (items fetched before the 1st step: resumed = fresh)",
            f"{lathe_slow['resume'][1]} vs {lathe_slow['fresh'][1]} items",
            "met" if lathe_slow["resume"][1] == lathe_slow["fresh"][1] else "**missed**",
        )
    )
    verdicts.append(
        (
            "lathe time to 1st step after resume ≈ fresh run (slow dataset; resumed − fresh)",
            f"{_ms(lathe_slow['resume'][0])} vs {_ms(lathe_slow['fresh'][0])} ({_ms(delta)})",
            "met" if delta < 0.5 * loaded_if_iterated else "**missed**",
        )
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["prepare", "save", "resume"])
    parser.add_argument("--impl", choices=["hf", "lathe"])
    parser.add_argument("--mode", choices=["fresh", "resume"], default="fresh")
    parser.add_argument("--dataset", choices=["fast", "slow"], default="fast")
    parser.add_argument("--checkpoint")
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--skip", default="", help="comma-separated: save,resume")
    parser.add_argument("--python", help="interpreter for the workers (default bench/.venv-peers/bin/python)")
    parser.add_argument(
        "--report", help="markdown output (default docs/BENCHMARKS_checkpoints.md; --quick: bench/results/)"
    )
    parser.add_argument("--render", metavar="RAW_JSON", help="only re-render the report from saved raw results")
    args = parser.parse_args()
    if args.render:
        raw = Path(args.render).resolve()
        results = json.loads(raw.read_text())
        default = REPOSITORY / "docs" / "BENCHMARKS_checkpoints.md"
        Path(args.report or default).write_text(render(results, raw))
    elif args.worker:
        worker_main(args)
    else:
        args.repeats = min(args.repeats, 2) if args.quick else args.repeats
        orchestrate(args)


if __name__ == "__main__":
    main()
