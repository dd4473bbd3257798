"""Run under torchrun by tests/llm/test_grpo_multiprocess.py: each run trains one case of
grpo_cases.MULTIPROCESS_CASES with lathe's GRPOTrainer (or of RLOO_MULTIPROCESS_CASES with its RLOOTrainer) on every
process and returns, from rank 0, the logs and
every process's generations (sampled tokens, rewards, advantages), as bench/grpo_goldens.py records TRL's."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import grpo_cases  # noqa: E402
from test_grpo_golden import run_lathe_case  # noqa: E402

from lathe.train.parallel.distributed import gather_objects  # noqa: E402
from tests.train.torchrun_helpers import worker_main  # noqa: E402


def run(output_dir: str, options: dict) -> dict:
    torch.set_num_threads(1)
    if "stage_config" in options:  # `lathe train` of a stage grpo config, in these processes
        return run_stage(options["stage_config"])
    overrides = options.get("overrides", {})
    if options.get("trainer") == "rloo":  # RLOOTrainer on a case of grpo_cases.RLOO_MULTIPROCESS_CASES
        table, overrides = grpo_cases.RLOO_MULTIPROCESS_CASES, {**overrides, "trainer": "rloo"}
    else:
        table = grpo_cases.MULTIPROCESS_CASES
    result = run_lathe_case(options["case"], options["model_dir"], output_dir, table, **overrides)
    result["generations"] = gather_objects(result["generations"])
    import torch.distributed as dist

    result["rank"] = dist.get_rank()
    return result


def run_stage(path: str) -> dict:
    import json

    import torch.distributed as dist

    from lathe.llm.config import parse_train_config
    from lathe.llm.workflows.stages import run_train

    config = parse_train_config(path)
    run_train(config)
    if dist.get_rank() != 0:  # the first process writes the run's files
        return {"rank": dist.get_rank()}
    logs = json.loads(Path(config.training.output_dir, "trainer_state.json").read_text())["log_history"]
    return {"logs": logs, "rank": 0}


if __name__ == "__main__":
    worker_main(run)
