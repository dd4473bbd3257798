"""Ray Train end to end on a local Ray of 2 CPUs (too slow for the suite: each Ray run starts a controller and
two workers that import torch, about a minute on a busy 2-core machine). The parts, and what each checks (the
numbers it prints are recorded in docs/DISTRIBUTED.md):

- torchrun: `USE_RAY=1 lathe train` of the quickstart (the CLI, which starts its own Ray) on 2 workers gives
  torchrun's losses and weights on 2 processes (same per-process batch);
- killed: the same with ray_max_failures=1 and one worker killed (SIGKILL) once Ray registered a stored
  checkpoint: Ray restarts the worker group, lathe resumes from that checkpoint, the final weights equal the
  uninterrupted run's;
- rerun: the run of `torchrun` launched again with the same ray_run_name: a checkpoint of an earlier launch is not
  resumed (as LLaMA-Factory; the quickstart has overwrite_output_dir: true), it trains from the start to the same
  weights;
- script: a Trainer script under TorchTrainer (RayCheckpointReport + ray_checkpoint, docs/DISTRIBUTED.md), with a
  worker killed the same way, ends on the weights of one process with the whole batch;
- raycallback: that script with Ray's own RayTrainReportCallback in place of lathe's RayCheckpointReport;
- lf: LLaMA-Factory 0.9.4's examples/train_lora/qwen3_lora_sft_ray.yaml with USE_RAY=1, from a checkout of that
  tag in $LF_DIR (its data/ folder is read), a local tiny model (the tests' byte-level BPE tokenizer and 3-layer
  Llama) and, for a 2-core machine without GPUs: ray_num_workers=2, resources_per_worker={"CPU": 1},
  max_samples=32, max_steps=2, bf16 off, preprocessing_num_workers=1, dataloader_num_workers=0, save_steps=1.

    OMP_NUM_THREADS=1 LF_DIR=... python bench/ray_train_bench.py [PART ...]   # all parts: about 11 minutes
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

from lathe.train import TrainerCallback

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


def lathe_train(output_dir: Path, env: dict, *extra: str, config="examples/quickstart.yaml", quick=QUICK):
    command = [sys.executable, "-m", "lathe", "train", str(config), f"output_dir={output_dir}"]
    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPOSITORY))
    return subprocess.run(
        [*command, *quick, *extra], cwd=REPOSITORY, env={**base, **env}, capture_output=True, text=True, timeout=900
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
    """Once Ray Train registered `checkpoints` checkpoints (its controller polls the workers every 2 s and then
    writes checkpoint_manager_snapshot.json; a checkpoint uploaded but not yet registered would not be resumed),
    SIGKILL one Ray Train worker (the newest process)."""

    def registered() -> int:
        with contextlib.suppress(OSError, ValueError):
            return len(json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())["checkpoint_results"])
        return 0

    def watch():
        deadline = time.time() + 600
        while time.time() < deadline:
            if registered() >= checkpoints and worker_pids():
                pid = worker_pids()[-1]
                os.kill(pid, signal.SIGKILL)
                killed.update(pid=pid, registered=registered())
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


class SlowSteps(TrainerCallback):
    """50 ms after each step (the tiny model trains 120 steps in 2 s): time for the kill to land mid-run."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)


def trainer_script(config: dict) -> None:
    """A Trainer script as a Ray Train training function: the process group is Ray's; each checkpoint is reported
    to Ray's storage; after a restart, training resumes from the last checkpoint Ray stored."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lathe.llm.launch.ray_train import RayCheckpointReport, ray_checkpoint
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
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[SlowSteps()])
    if config.get("ray_callback"):  # Ray's own transformers callback instead of lathe's
        from ray.train.huggingface.transformers import RayTrainReportCallback

        trainer.add_callback(RayTrainReportCallback())
    elif config["ray"]:
        trainer.add_callback(RayCheckpointReport())
    with ray_checkpoint() if config["ray"] else contextlib.nullcontext() as resume:
        if resume is not None:
            state = json.loads((Path(resume) / "trainer_state.json").read_text())
            print(f"trainer script: resuming at step {state['global_step']} from {resume}", flush=True)
        trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()


def main() -> None:
    parts = sys.argv[1:] or ["torchrun", "killed", "rerun", "script", "raycallback", "lf"]
    root = Path(os.environ.get("RAY_BENCH_DIR", "/tmp/lathe_ray_bench"))
    report = {}
    if "torchrun" in parts:
        subprocess.run(["rm", "-rf", str(root)], check=True)
        report.update(ray_and_torchrun(root))
    if "killed" in parts:
        report.update(killed_worker(root))
    if "rerun" in parts:
        report.update(rerun_same_name(root))
    if "script" in parts:
        report.update(trainer_script_runs(root))
    if "raycallback" in parts:
        report.update(ray_callback_run(root))
    if "lf" in parts:
        report.update(llamafactory_example(root))
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
    """As the plain Ray run, with ray_max_failures=1 and a worker killed once a checkpoint is registered."""
    report, storage = {}, [f"ray_storage_path={root / 'storage'}"]
    subprocess.run(["rm", "-rf", str(root / "killed"), str(root / "storage/killed")], check=True)
    started, killed = time.time(), {}
    kill_a_worker_after(root / "storage/killed", 1, killed)
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


def rerun_same_name(root: Path) -> dict:
    storage = [f"ray_storage_path={root / 'storage'}"]
    before = len(list((root / "storage/plain").glob("checkpoint_*/checkpoint")))
    started = time.time()
    run = lathe_train(root / "ray", {"USE_RAY": "1"}, "ray_num_workers=2", RAY_INIT, *storage, "ray_run_name=plain")
    output = run.stdout + run.stderr
    if run.returncode != 0:
        print(output[-5000:])
    return {
        "rerun_s": round(time.time() - started, 1),
        "rerun_exit_code": run.returncode,
        "rerun_resumed": sum("Ray Train stored" in line for line in output.splitlines()),
        "rerun_stored_checkpoints_before_after": [
            before,
            len(list((root / "storage/plain").glob("checkpoint_*/checkpoint"))),
        ],
        "rerun_vs_torchrun_weights": largest_difference(
            weights(root / "ray/model.safetensors"), weights(root / "torchrun/model.safetensors")
        )
        if run.returncode == 0
        else None,
    }


def trainer_script_runs(root: Path) -> dict:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    subprocess.run(["rm", "-rf", *(str(root / name) for name in ("script_one", "script_ray", "storage/script"))])
    trainer_script({"output_dir": str(root / "script_one"), "batch": 8, "ray": False})
    ray.init(num_cpus=2, include_dashboard=False)
    started, killed = time.time(), {}
    kill_a_worker_after(root / "storage/script", 1, killed)
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


def ray_callback_run(root: Path) -> dict:
    """The Trainer script with Ray's RayTrainReportCallback (every rank uploads the same checkpoint folder)."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    subprocess.run(["rm", "-rf", str(root / "script_raycb"), str(root / "storage/raycb")])
    if not (root / "script_one/model.safetensors").exists():
        trainer_script({"output_dir": str(root / "script_one"), "batch": 8, "ray": False})
    ray.init(num_cpus=2, include_dashboard=False)
    result = TorchTrainer(
        trainer_script,
        train_loop_config={"output_dir": str(root / "script_raycb"), "batch": 4, "ray": True, "ray_callback": True},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="raycb", storage_path=str(root / "storage")),
    ).fit()
    ray.shutdown()
    stored = sorted((root / "storage/raycb").glob("checkpoint_*/checkpoint"))
    return {
        "raycb_stored": len(stored),
        "raycb_last_step": json.loads((stored[-1] / "trainer_state.json").read_text())["global_step"]
        if stored
        else None,
        "raycb_rng_files": sorted(p.name for p in stored[-1].glob("rng_state*")) if stored else None,
        "raycb_checkpoint": result.checkpoint.path if result.checkpoint else None,
        "raycb_vs_one_process_weights": largest_difference(
            weights(root / "script_raycb/model.safetensors"), weights(root / "script_one/model.safetensors")
        ),
    }


def llamafactory_example(root: Path) -> dict:
    sys.path.insert(0, str(REPOSITORY / "tests/llm"))
    from conftest import build_tiny_model, build_tiny_tokenizer  # the tests' byte-level BPE and 3-layer Llama

    checkout = Path(os.environ.get("LF_DIR", REPOSITORY / "bench/.cache/LLaMA-Factory-0.9.4"))
    model_dir = root / "lf_model"
    build_tiny_tokenizer(model_dir)
    from transformers import AutoTokenizer

    build_tiny_model(model_dir, len(AutoTokenizer.from_pretrained(model_dir)))
    subprocess.run(["rm", "-rf", str(root / "lf_out"), str(root / "storage/qwen3_4b_sft_lora")])
    extra = [f"model_name_or_path={model_dir}", f"dataset_dir={checkout / 'data'}", "ray_num_workers=2"]
    extra += ['resources_per_worker={"CPU": 1}', f"ray_storage_path={root / 'storage'}", RAY_INIT, "bf16=false"]
    extra += [
        "max_samples=32",
        "max_steps=2",
        "save_steps=1",
        "preprocessing_num_workers=1",
        "dataloader_num_workers=0",
    ]
    started = time.time()
    run = lathe_train(
        root / "lf_out",
        {"USE_RAY": "1"},
        *extra,
        config=checkout / "examples/train_lora/qwen3_lora_sft_ray.yaml",
        quick=[],
    )
    print(run.stdout + run.stderr)
    stored = sorted((root / "storage/qwen3_4b_sft_lora").glob("checkpoint_*/checkpoint"))
    return {
        "lf_example_s": round(time.time() - started, 1),
        "lf_example_exit_code": run.returncode,
        "lf_example_stored": [sorted(p.name for p in folder.iterdir() if "adapter" in p.name) for folder in stored],
        "lf_example_losses": losses(root / "lf_out") if (root / "lf_out/trainer_log.jsonl").exists() else None,
    }


if __name__ == "__main__":
    main()
