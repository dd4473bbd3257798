"""Regenerate the TRL RLOO goldens that tests/llm/test_rloo.py compares lathe against: for each case of
grpo_cases.RLOO_CASES (the GRPO cases' model, prompts and reward functions), every generation batch's completion
tokens, rewards and advantages and every step's logged metrics from TRL 1.16's RLOOTrainer on the CPU.

    python bench/rloo_goldens.py [--python bench/.cache/trl-venv/bin/python] [--case NAME] [--processes 2]

Run from the repository root with any Python: it re-runs itself in TRL's environment (`--worker`), where lathe is
not imported (see bench/grpo_goldens.py for that environment). Writes tests/llm/golden/trl_rloo.json; with
`--processes 2`, the cases of grpo_cases.RLOO_MULTIPROCESS_CASES run by TRL on 2 CPU processes (torchrun, gloo)
into trl_rloo_2proc.json, each process's generations recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "llm" / "golden" / "trl_rloo.json"
MULTIPROCESS_GOLDEN = ROOT / "tests" / "llm" / "golden" / "trl_rloo_2proc.json"
sys.path.insert(0, str(ROOT / "tests" / "llm"))
sys.path.insert(0, str(ROOT / "bench"))


def run_trl_case(name: str, model_dir: str, table: dict | None = None) -> dict:
    import grpo_cases
    from grpo_goldens import recording
    from peft import LoraConfig
    from trl import RLOOConfig, RLOOTrainer

    settings = {**grpo_cases.BASE, **(table if table is not None else grpo_cases.RLOO_CASES)[name]}
    lora = settings.pop("lora", None)
    conversational = settings.pop("conversational", False)
    if "reward_clip_range" in settings:
        settings["reward_clip_range"] = tuple(settings["reward_clip_range"])
    generations, rewards = [], {}

    class Recording(RLOOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            mask = output["completion_mask"].bool()
            ids = [row[m].tolist() for row, m in zip(output["completion_ids"], mask)]
            generations.append({"completion_ids": ids, "advantages": output["advantages"].tolist()})
            return output

    with tempfile.TemporaryDirectory() as out:
        out = os.path.join(model_dir, "out", name) if table is not None else out  # one folder for every rank
        trainer = Recording(
            model=model_dir,
            reward_funcs=recording(grpo_cases.REWARDS, rewards),
            args=RLOOConfig(output_dir=out, **settings),
            train_dataset=grpo_cases.dataset(conversational),
            processing_class=grpo_cases.tokenizer(conversational),
            peft_config=LoraConfig(**lora) if lora else None,
        )
        trainer.train()
    for index, generation in enumerate(generations):
        generation["rewards"] = {key: values[index] for key, values in rewards.items()}
    return grpo_cases.record(trainer, generations)


def worker(cases: list[str]) -> None:
    import grpo_cases
    import torch
    import transformers
    import trl

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as model_dir:
        grpo_cases.build_model(model_dir)
        results = {name: run_trl_case(name, model_dir) for name in cases}
    versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    print("GOLDEN-JSON " + json.dumps({"versions": versions, "cases": results}))


def multiprocess_worker(cases: list[str], model_dir: str) -> None:
    """Under torchrun: every process runs each case; rank 0 prints the logs and every process's generations."""
    import grpo_cases
    import torch
    import transformers
    import trl
    from accelerate.utils import gather_object

    torch.set_num_threads(1)
    results = {}
    for name in cases:
        result = run_trl_case(name, model_dir, grpo_cases.RLOO_MULTIPROCESS_CASES)
        result["generations"] = gather_object([result["generations"]])  # one list per process, in rank order
        results[name] = result
    if int(os.environ.get("RANK", "0")) == 0:
        versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
        print("GOLDEN-JSON " + json.dumps({"versions": versions, "processes": 2, "cases": results}))


def run_multiprocess(python: str, cases: list[str]) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    with tempfile.TemporaryDirectory() as model_dir:
        build = f"import sys; sys.path.insert(0, {str(ROOT / 'tests' / 'llm')!r}); import grpo_cases; "
        build += f"grpo_cases.build_model({model_dir!r})"
        done = subprocess.run([python, "-c", build], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"building the model failed:\n{done.stderr[-4000:]}")
        command = [python, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}", __file__]
        command += ["--worker", "--model-dir", model_dir, *sum((["--case", c] for c in cases), [])]
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    line = next((x for x in done.stdout.splitlines() if x.startswith("GOLDEN-JSON ")), None)
    if done.returncode != 0 or line is None:
        sys.exit(f"the TRL workers failed ({done.returncode}):\n{done.stderr[-6000:]}")
    MULTIPROCESS_GOLDEN.write_text(json.dumps(json.loads(line[len("GOLDEN-JSON ") :]), indent=1) + "\n")
    print(f"wrote {MULTIPROCESS_GOLDEN} ({', '.join(cases)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / "bench" / ".cache" / "trl-venv" / "bin" / "python"))
    parser.add_argument("--case", action="append", help="only these cases (default: all); merged into the file")
    parser.add_argument("--processes", type=int, default=1, choices=(1, 2), help="2: the multi-process cases")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    options = parser.parse_args()
    import grpo_cases

    if options.worker and options.model_dir:
        multiprocess_worker(options.case, options.model_dir)
        return
    if options.processes == 2:
        run_multiprocess(options.python, options.case or list(grpo_cases.RLOO_MULTIPROCESS_CASES))
        return

    cases = options.case or list(grpo_cases.RLOO_CASES)
    if options.worker:
        worker(cases)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    command = [options.python, __file__, "--worker", *sum((["--case", c] for c in cases), [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    line = next((x for x in done.stdout.splitlines() if x.startswith("GOLDEN-JSON ")), None)
    if done.returncode != 0 or line is None:
        sys.exit(f"the TRL worker failed ({done.returncode}):\n{done.stderr[-4000:]}")
    fresh = json.loads(line[len("GOLDEN-JSON ") :])
    old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {"cases": {}}
    old["cases"].update(fresh["cases"])
    GOLDEN.write_text(json.dumps({"versions": fresh["versions"], "cases": old["cases"]}, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({', '.join(cases)})")


if __name__ == "__main__":
    main()
