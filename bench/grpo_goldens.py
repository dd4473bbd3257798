"""Regenerate the TRL GRPO goldens that tests/llm/test_grpo_golden.py compares lathe against: for each case
of tests/llm/grpo_cases.py, every generation batch's completion tokens, rewards and advantages and every
step's logged metrics (loss, grad_norm, kl, entropy, clip ratios, completion lengths, rewards) from TRL's
GRPOTrainer on the CPU.

    python -m venv bench/.cache/trl-venv
    bench/.cache/trl-venv/bin/pip install torch==2.13.0 transformers==5.23.0 trl==1.16.0 accelerate datasets peft
    python bench/grpo_goldens.py [--python bench/.cache/trl-venv/bin/python] [--case NAME] [--processes 2]

Run from the repository root with any Python: it re-runs itself in TRL's environment (`--worker`), where
lathe is not imported. Writes tests/llm/golden/trl_grpo.json with the versions that produced it; with
`--processes 2`, the cases of grpo_cases.MULTIPROCESS_CASES run by TRL on 2 CPU processes (torchrun, gloo;
accelerate picks the processes up from torchrun's environment) into trl_grpo_2proc.json, each process's
generations recorded. With `--tools`, the tool-calling cases of grpo_tool_cases.py (TRL's `tools`,
`environment_factory` and `max_tool_calling_iterations` over the committed tiny model that calls `add`) into
trl_grpo_tools.json; `--rebuild-tool-model` first re-teaches that model (minutes of CPU) with TRL's copy of
Qwen2.5's chat template.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "llm" / "golden" / "trl_grpo.json"
TOOLS_GOLDEN = ROOT / "tests" / "llm" / "golden" / "trl_grpo_tools.json"
MULTIPROCESS_GOLDEN = ROOT / "tests" / "llm" / "golden" / "trl_grpo_2proc.json"
sys.path.insert(0, str(ROOT / "tests" / "llm"))


def recording(functions, sink):
    wrapped = []
    for function in functions:

        @functools.wraps(function)
        def call(*args, _function=function, **kwargs):
            values = _function(*args, **kwargs)
            sink.setdefault(_function.__name__, []).append(list(values))
            return values

        wrapped.append(call)
    return wrapped


def run_trl_case(name: str, model_dir: str, table: dict | None = None, output_dir: str | None = None) -> dict:
    import grpo_cases
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    settings = {**grpo_cases.BASE, **(table if table is not None else grpo_cases.CASES)[name]}
    lora = settings.pop("lora", None)
    conversational = settings.pop("conversational", False)
    functions = grpo_cases.reward_funcs([], model_dir, settings)  # the reward model's folder, if any
    rollout_func = grpo_cases.rollout_of(settings)
    generations, rewards = [], {}

    class Recording(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            mask = output["completion_mask"].bool()
            ids = [row[m].tolist() for row, m in zip(output["completion_ids"], mask)]
            generations.append({"completion_ids": ids, "advantages": output["advantages"].tolist()})
            return output

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=output_dir or out, **settings)
        trainer = Recording(
            model=model_dir,
            reward_funcs=[*recording(grpo_cases.REWARDS, rewards), *functions],
            args=args,
            train_dataset=grpo_cases.dataset(conversational),
            processing_class=grpo_cases.tokenizer(conversational),
            peft_config=LoraConfig(**lora) if lora else None,
            rollout_func=rollout_func,
        )
        trainer.train()
    for index, generation in enumerate(generations):
        generation["rewards"] = {key: values[index] for key, values in rewards.items()}
    return grpo_cases.record(trainer, generations)


def run_trl_tool_case(name: str, model_dir: str) -> dict:
    """A case of grpo_tool_cases.CASES under TRL: the completions' tokens (tool results included), their tool
    masks, rewards and advantages at every generation, and every step's log."""
    import grpo_tool_cases
    from trl import GRPOConfig, GRPOTrainer

    settings = {**grpo_tool_cases.BASE, **grpo_tool_cases.CASES[name]}
    tools = [grpo_tool_cases.add] if settings.pop("tools", False) else None
    kind = settings.pop("environment", None)
    factory = grpo_tool_cases.environment_factory(kind) if kind else None
    generations, rewards = [], {}

    class Recording(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            mask = output["completion_mask"].bool()
            ids = [row[m].tolist() for row, m in zip(output["completion_ids"], mask)]
            tool_mask = [row[m].tolist() for row, m in zip(output["tool_mask"], mask)]
            generations.append(
                {"completion_ids": ids, "tool_mask": tool_mask, "advantages": output["advantages"].tolist()}
            )
            return output

    with tempfile.TemporaryDirectory() as out:
        trainer = Recording(
            model=model_dir,
            reward_funcs=recording(grpo_tool_cases.REWARDS, rewards),
            args=GRPOConfig(output_dir=out, **settings),
            train_dataset=grpo_tool_cases.dataset(kind),
            tools=tools,
            environment_factory=factory,
        )
        trainer.train()
    for index, generation in enumerate(generations):
        generation["rewards"] = {key: values[index] for key, values in rewards.items()}
    return grpo_tool_cases.record(trainer, generations)


def tools_worker(cases: list[str], rebuild: bool) -> None:
    import grpo_tool_cases
    import torch
    import transformers
    import trl

    torch.set_num_threads(1)
    if rebuild:
        template = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
        grpo_tool_cases.build_tool_model(grpo_tool_cases.MODEL, template.read_text())
    results = {}
    with tempfile.TemporaryDirectory() as model_dir:
        grpo_tool_cases.copy_model(model_dir)
        for name in cases:
            results[name] = run_trl_tool_case(name, model_dir)
    versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    print("GOLDEN-JSON " + json.dumps({"versions": versions, "cases": results}))


def worker(cases: list[str]) -> None:
    import grpo_cases
    import torch
    import transformers
    import trl

    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as model_dir:
        grpo_cases.build_model(model_dir)
        for name in cases:
            results[name] = run_trl_case(name, model_dir)
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
        result = run_trl_case(name, model_dir, grpo_cases.MULTIPROCESS_CASES, os.path.join(model_dir, "out", name))
        result["generations"] = gather_object([result["generations"]])  # one list per process, in rank order
        results[name] = result
    if int(os.environ.get("RANK", "0")) == 0:
        versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
        print("GOLDEN-JSON " + json.dumps({"versions": versions, "processes": 2, "cases": results}))


def run_multiprocess(python: str, cases: list[str]) -> None:
    import socket

    import grpo_cases

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    with tempfile.TemporaryDirectory() as model_dir:
        done = subprocess.run(
            [
                python,
                "-c",
                f"import sys; sys.path.insert(0, {str(ROOT / 'tests' / 'llm')!r}); import grpo_cases; "
                f"grpo_cases.build_model({model_dir!r})",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            sys.exit(f"building the model failed:\n{done.stderr[-4000:]}")
        command = [
            python,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={port}",
            __file__,
            "--worker",
            "--model-dir",
            model_dir,
            *sum((["--case", c] for c in cases), []),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    line = next((x for x in done.stdout.splitlines() if x.startswith("GOLDEN-JSON ")), None)
    if done.returncode != 0 or line is None:
        sys.exit(f"the TRL workers failed ({done.returncode}):\n{done.stderr[-6000:]}")
    fresh = json.loads(line[len("GOLDEN-JSON ") :])
    old = json.loads(MULTIPROCESS_GOLDEN.read_text()) if MULTIPROCESS_GOLDEN.exists() else {"cases": {}}
    old["cases"].update(fresh["cases"])
    fresh["cases"] = {name: old["cases"][name] for name in grpo_cases.MULTIPROCESS_CASES if name in old["cases"]}
    MULTIPROCESS_GOLDEN.write_text(json.dumps(fresh, indent=1) + "\n")
    print(f"wrote {MULTIPROCESS_GOLDEN} ({', '.join(cases)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / "bench" / ".cache" / "trl-venv" / "bin" / "python"))
    parser.add_argument("--case", action="append", help="only these cases (default: all); merged into the file")
    parser.add_argument("--processes", type=int, default=1, choices=(1, 2), help="2: the multi-process cases")
    parser.add_argument("--tools", action="store_true", help="the tool-calling cases (grpo_tool_cases.py)")
    parser.add_argument("--rebuild-tool-model", action="store_true", help="re-teach the committed tool model")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    options = parser.parse_args()
    import grpo_cases

    if options.worker and options.model_dir:
        multiprocess_worker(options.case, options.model_dir)
        return
    if options.processes == 2:
        run_multiprocess(options.python, options.case or list(grpo_cases.MULTIPROCESS_CASES))
        return
    import grpo_tool_cases

    table = grpo_tool_cases.CASES if options.tools else grpo_cases.CASES
    cases = options.case or list(table)
    if options.worker:
        if options.tools:
            tools_worker(cases, options.rebuild_tool_model)
        else:
            worker(cases)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    flags = ["--tools"] * options.tools + ["--rebuild-tool-model"] * options.rebuild_tool_model
    command = [options.python, __file__, "--worker", *flags, *sum((["--case", c] for c in cases), [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    line = next((x for x in done.stdout.splitlines() if x.startswith("GOLDEN-JSON ")), None)
    if done.returncode != 0 or line is None:
        sys.exit(f"the TRL worker failed ({done.returncode}):\n{done.stderr[-4000:]}")
    fresh = json.loads(line[len("GOLDEN-JSON ") :])
    golden = TOOLS_GOLDEN if options.tools else GOLDEN
    old = json.loads(golden.read_text()) if golden.exists() else {"cases": {}}
    old["cases"].update(fresh["cases"])
    golden.write_text(json.dumps({"versions": fresh["versions"], "cases": old["cases"]}, indent=1) + "\n")
    print(f"wrote {golden} ({', '.join(cases)})")


if __name__ == "__main__":
    main()
