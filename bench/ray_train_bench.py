"""Ray Train end to end on a local Ray of 2 CPUs (too slow for the suite: each Ray run starts a controller and
two workers that import torch, about a minute on a busy 2-core machine). What it checks, with the numbers it
prints (recorded in docs/DISTRIBUTED.md):

1. `USE_RAY=1 lathe train` (the CLI, which starts its own Ray) on 2 workers gives torchrun's losses and weights
   on 2 processes (same per-process batch);
2. the same with ray_max_failures=1 and one worker killed (SIGKILL) after two checkpoints reached Ray's storage:
   Ray restarts the worker group, lathe resumes from the last checkpoint Ray stored, and the final weights equal
   the uninterrupted run's;
3. a Trainer script launched through TorchTrainer (RayCheckpointReport + ray_checkpoint, see
   docs/DISTRIBUTED.md), with a worker killed the same way, ends on the weights of one process with the whole batch.

    OMP_NUM_THREADS=1 python bench/ray_train_bench.py [torchrun] [killed] [script]   # all: about 5 minutes
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

REPOSITORY = Path(__file__).resolve().parents[1]
QUICK = [
    "max_samples=256",
    "max_steps=30",
    "save_steps=5",
    "save_strategy=steps",
    "do_predict=false",
    "logging_steps=1",
]
QUICK += ["per_device_train_batch_size=4"]
RAY_INIT = 'ray_init_kwargs={"num_cpus": 2, "include_dashboard": false}'


def lathe_train(output_dir: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "lathe", "train", "examples/quickstart.yaml", f"output_dir={output_dir}"]
    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY))
    return subprocess.run(
        [*command, *QUICK, *extra], cwd=REPOSITORY, env={**base, **env}, capture_output=True, text=True, timeout=900
    )


def worker_pids() -> list[int]:
    """The processes of Ray Train's workers (Ray names them ray::RayTrainWorker...)."""
    pids = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and b"RayTrainWorker" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return sorted(pids)


def kill_a_worker_after(run_dir: Path, checkpoints: int, killed: dict) -> threading.Thread:
    """Once `checkpoints` checkpoints are in Ray's storage, SIGKILL one Ray Train worker (the newest process)."""

    def watch():
        deadline = time.time() + 600
        while time.time() < deadline:
            if len(list(run_dir.glob("checkpoint_*"))) >= checkpoints and worker_pids():
                pid = worker_pids()[-1]
                os.kill(pid, signal.SIGKILL)
                killed.update(pid=pid, after=sorted(p.name for p in run_dir.glob("checkpoint_*")))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path)


def largest_difference(ours: dict, theirs: dict) -> float:
    assert sorted(ours) == sorted(theirs)
    return max((ours[name] - theirs[name]).abs().max().item() for name in theirs)


def losses(folder: Path) -> list[float]:
    entries = [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]
    return [entry["loss"] for entry in entries if "loss" in entry]


def trainer_script(config: dict) -> None:
    """A Trainer script as a Ray Train training function: the process group is Ray's; each checkpoint is reported
    to Ray's storage; after a restart, training resumes from the last checkpoint Ray stored."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lathe.llm.ray_train import RayCheckpointReport, ray_checkpoint
    from lathe.train import Trainer, TrainingArguments

    torch.manual_seed(0)
    shape = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, num_key_value_heads=2, **shape))
    rows = torch.randint(0, 64, (512, 8), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in rows]
    args = TrainingArguments(
        output_dir=config["output_dir"],
        per_device_train_batch_size=config["batch"],
        max_steps=120,
        save_steps=10,
        logging_steps=10,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    if config["ray"]:
        trainer.add_callback(RayCheckpointReport())
    with ray_checkpoint() if config["ray"] else contextlib.nullcontext() as resume:
        if resume is not None:
            state = json.loads((Path(resume) / "trainer_state.json").read_text())
            print(f"trainer script: resuming at step {state['global_step']} from {resume}", flush=True)
        trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()


def main() -> None:
    parts = sys.argv[1:] or ["torchrun", "killed", "script"]
    root = Path(os.environ.get("RAY_BENCH_DIR", "/tmp/lathe_ray_bench"))
    report = {}
    if "torchrun" in parts:
        subprocess.run(["rm", "-rf", str(root)], check=True)
        report.update(ray_and_torchrun(root))
    if "killed" in parts:
        report.update(killed_worker(root))
    if "script" in parts:
        report.update(trainer_script_runs(root))
    print(json.dumps(report, indent=1))


def ray_and_torchrun(root: Path) -> dict:
    report = {}
    started = time.time()
    torchrun = lathe_train(root / "torchrun", {"NPROC_PER_NODE": "2"})
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    report["torchrun_s"] = round(time.time() - started, 1)

    started = time.time()
    storage = [f"ray_storage_path={root / 'storage'}"]
    ray = lathe_train(root / "ray", {"USE_RAY": "1"}, "ray_num_workers=2", RAY_INIT, *storage, "ray_run_name=plain")
    assert ray.returncode == 0, (ray.stdout + ray.stderr)[-3000:]
    report["ray_s"] = round(time.time() - started, 1)
    report["ray_vs_torchrun_loss"] = max(abs(a - b) for a, b in zip(losses(root / "ray"), losses(root / "torchrun")))
    report["ray_vs_torchrun_weights"] = largest_difference(
        weights(root / "ray/model.safetensors"), weights(root / "torchrun/model.safetensors")
    )
    report["ray_checkpoints_in_storage"] = len(list((root / "storage/plain").glob("checkpoint_*/checkpoint")))
    return report


def killed_worker(root: Path) -> dict:
    """As the plain Ray run, with ray_max_failures=1 and a worker killed after 2 checkpoints reached storage."""
    report, storage = {}, [f"ray_storage_path={root / 'storage'}"]
    subprocess.run(["rm", "-rf", str(root / "killed"), str(root / "storage/killed")], check=True)
    started, killed = time.time(), {}
    kill_a_worker_after(root / "storage/killed", 2, killed)
    again = lathe_train(
        root / "killed",
        {"USE_RAY": "1"},
        "ray_num_workers=2",
        RAY_INIT,
        *storage,
        "ray_run_name=killed",
        "ray_max_failures=1",
    )
    report["killed_s"] = round(time.time() - started, 1)
    report["killed"] = killed
    report["killed_exit_code"] = again.returncode
    output = again.stdout + again.stderr
    report["killed_resumed_from"] = [
        line.split("stored: ")[-1] for line in output.splitlines() if "Ray Train stored" in line
    ]
    if again.returncode == 0:
        report["killed_vs_uninterrupted_weights"] = largest_difference(
            weights(root / "killed/model.safetensors"), weights(root / "ray/model.safetensors")
        )
    else:
        print(output[-5000:])
    return report


def trainer_script_runs(root: Path) -> dict:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    subprocess.run(["rm", "-rf", *(str(root / name) for name in ("script_one", "script_ray", "storage/script"))])
    trainer_script({"output_dir": str(root / "script_one"), "batch": 8, "ray": False})
    ray.init(num_cpus=2, include_dashboard=False)
    started, killed = time.time(), {}
    kill_a_worker_after(root / "storage/script", 2, killed)
    result = TorchTrainer(
        trainer_script,
        train_loop_config={"output_dir": str(root / "script_ray"), "batch": 4, "ray": True},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="script", storage_path=str(root / "storage"), failure_config=FailureConfig(max_failures=1)
        ),
    ).fit()
    ray.shutdown()
    return {
        "script_s": round(time.time() - started, 1),
        "script_killed": killed,
        "script_checkpoint": result.checkpoint.path if result.checkpoint else None,
        "script_vs_one_process_weights": largest_difference(
            weights(root / "script_ray/model.safetensors"), weights(root / "script_one/model.safetensors")
        ),
    }


if __name__ == "__main__":
    main()
