"""Trainer.accelerator's collectives on 2 gloo processes (tests/train/test_accelerator.py): writes what each
call returned, from rank 0, as JSON. argv: output folder, result file, options (unused)."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from lathe import Trainer, TrainingArguments
from tests.train.trainer_helpers import Regression, regression_items


def main(output_dir: str, result_file: str) -> None:
    args = TrainingArguments(output_dir=output_dir, report_to="none", use_cpu=True, save_strategy="no")
    accelerator = Trainer(model=Regression(), args=args, train_dataset=regression_items(4)).accelerator
    rank = accelerator.process_index
    result = {
        "gather": accelerator.gather(torch.tensor([0.0, 1.0]) + 10 * rank).tolist(),
        "gather_scalar": accelerator.gather(torch.tensor(float(rank))).tolist(),
        "objects": accelerator.gather_for_metrics(["r0"] if rank == 0 else ["r1a", "r1b"]),
        "pad": accelerator.gather(
            accelerator.pad_across_processes(torch.full((1, rank + 1), float(rank)), dim=1, pad_index=-1)
        ).tolist(),
        "pad_first": accelerator.pad_across_processes(torch.zeros(1 + 2 * rank), pad_index=-1, pad_first=True).tolist(),
        "reduce_sum": accelerator.reduce(torch.tensor(float(rank + 1))).item(),
        "reduce_mean": accelerator.reduce(torch.tensor(float(rank + 1)), reduction="mean").item(),
        "reduce_max": accelerator.reduce(torch.tensor(float(rank + 1)), reduction="max").item(),
    }
    with accelerator.split_between_processes(list(range(5))) as part:
        result["split"] = accelerator.gather_for_metrics([part])
    with accelerator.split_between_processes(list(range(5)), apply_padding=True) as part:
        result["split_padded"] = accelerator.gather_for_metrics([part])
    info = [rank, accelerator.num_processes, accelerator.distributed_type.value, accelerator.is_main_process]
    result["info"] = accelerator.gather_for_metrics([info])
    with accelerator.main_process_first():
        accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with open(result_file, "w") as handle:
            json.dump(result, handle)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
