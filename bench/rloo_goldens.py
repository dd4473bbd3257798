"""Regenerate the TRL RLOO goldens that tests/llm/test_rloo.py compares lathe against: for each case of
grpo_cases.RLOO_CASES (the GRPO cases' model, prompts and reward functions), every generation batch's completion
tokens, rewards and advantages and every step's logged metrics from TRL 1.16's RLOOTrainer on the CPU.

    python bench/rloo_goldens.py [--python bench/.cache/trl-venv/bin/python] [--case NAME]

Run from the repository root with any Python: it re-runs itself in TRL's environment (`--worker`), where lathe is
not imported (see bench/grpo_goldens.py for that environment). Writes tests/llm/golden/trl_rloo.json.
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
sys.path.insert(0, str(ROOT / "tests" / "llm"))
sys.path.insert(0, str(ROOT / "bench"))


def run_trl_case(name: str, model_dir: str) -> dict:
    import grpo_cases
    from grpo_goldens import recording
    from peft import LoraConfig
    from trl import RLOOConfig, RLOOTrainer

    settings = {**grpo_cases.BASE, **grpo_cases.RLOO_CASES[name]}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / "bench" / ".cache" / "trl-venv" / "bin" / "python"))
    parser.add_argument("--case", action="append", help="only these cases (default: all); merged into the file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    import grpo_cases

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
