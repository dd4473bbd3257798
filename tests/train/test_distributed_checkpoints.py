"""Data and checkpoints under several processes: the sharded batch order, and a DDP run of 2 CPU
ranks (gloo, torchrun) whose rank 1 dies: the run stops, its last checkpoint stays valid and resumes
under 2 ranks and under 1; and, with no torchrun to end the survivors, rank 0 stops by itself with a
clear message when rank 1 dies or hangs."""

from __future__ import annotations

import logging
import os

import pytest

from lathe.train.checkpoints import layout as ckpt
from lathe.train.data.sampling import EpochSampler, ResumableBatchSampler
from tests.train import fsdp_worker
from tests.train.torchrun_helpers import assert_same_weights, launch, torchrun


def shard_batches(
    num_samples: int, batch_size: int, shards: int, seed: int, epoch: int, skip: int = 0
) -> list[list[list[int]]]:
    per_shard = []
    for index in range(shards):
        sampler = ResumableBatchSampler(
            EpochSampler(num_samples, seed=seed), batch_size, num_shards=shards, shard_index=index
        )
        sampler.set_epoch(epoch)
        sampler.skip_batches(skip)
        per_shard.append(list(sampler))
    return per_shard


def test_shards_split_one_process_order_without_overlap_and_skip_per_rank():
    one = shard_batches(22, 2, 1, seed=4, epoch=1)[0]  # 11 batches
    two = shard_batches(22, 2, 2, seed=4, epoch=1)
    # rank r takes global batches r, r + 2, ...: together one process's order, the last rank completed
    # from the epoch's start (even batches), so only that repeated batch overlaps
    assert two[0] == one[0::2] and two[1] == one[1::2] + [one[0]]
    assert len(two[0]) == len(two[1]) == len(ResumableBatchSampler(EpochSampler(22), 2, num_shards=2)) == 6
    # the order depends only on (seed, epoch): built again, the same; another epoch or seed, another
    assert shard_batches(22, 2, 2, seed=4, epoch=1) == two
    assert shard_batches(22, 2, 2, seed=4, epoch=2) != two and shard_batches(22, 2, 2, seed=5, epoch=1) != two
    # resuming after 2 batches per rank skips exactly those on every rank
    assert shard_batches(22, 2, 2, seed=4, epoch=1, skip=2) == [two[0][2:], two[1][2:]]


@pytest.mark.slow
def test_killed_ddp_run_resumes_under_two_ranks_and_under_one(tmp_path, caplog):
    options = {"batch": 2, "accumulation": 2, "save_strategy": "steps", "save_steps": 2}
    # rank 1 dies at step 3; rank 0 waits in the next collective until torchrun ends it (or ddp_timeout)
    completed = launch(tmp_path, "killed", {**options, "die_at_step": 3, "ddp_timeout": 30}, timeout=120)
    assert completed.returncode != 0
    assert "exitcode  : 3" in completed.stderr and "fsdp_worker.py FAILED" in completed.stderr
    output = tmp_path / "killed"
    checkpoint = output / "checkpoint-2"
    assert ckpt.get_last_checkpoint(str(output)) == str(checkpoint) and ckpt.is_complete_checkpoint(str(checkpoint))
    files = set(os.listdir(checkpoint))
    assert {
        "rng_state_0.pth",
        "rng_state_1.pth",
        "optimizer.pt",
        "model.safetensors",
    } <= files and "rng_state.pth" not in files
    assert not (output / "final").exists()

    # the uninterrupted run (one process with twice the batch trains what 2 ranks do: test_distributed.py)
    whole = fsdp_worker.run(str(tmp_path / "whole"), {"batch": 4, "accumulation": 2})
    ddp = {"ddp_find_unused_parameters": True, "ddp_bucket_cap_mb": 5, "ddp_broadcast_buffers": False}
    resumed = torchrun(tmp_path, "resumed", {**options, "resume": str(checkpoint), "ddp": ddp})
    assert resumed["ddp"] == {
        "find_unused_parameters": True,
        "broadcast_buffers": False,
        "bucket_bytes_cap": 5 * 1024 * 1024,
    }
    assert resumed["losses"] == pytest.approx(whole["losses"], abs=1e-6)
    assert_same_weights(resumed["weights"], whole["weights"])
    # one process with twice the per-device batch has the same global batch: the same run
    with caplog.at_level(logging.INFO, logger="lathe.train.resume"):
        alone = fsdp_worker.run(str(tmp_path / "alone"), {"batch": 4, "accumulation": 2, "resume": str(checkpoint)})
    assert_same_weights(alone["weights"], whole["weights"])
    assert "written by 2 processes, resumed under 1 with the same global batch (4)" in caplog.text
    assert "differ from the run" not in caplog.text
    # the same per-device batch under 1 process halves the global batch: resumed, with a warning saying so
    caplog.clear()
    fsdp_worker.run(str(tmp_path / "halved"), {"batch": 2, "accumulation": 2, "resume": str(checkpoint), "epochs": 1})
    assert "processes: 2 -> 1, so the global batch (per-device batch x processes) is 2, was 4" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("hang", [False, True], ids=["dies", "hangs"])
def test_a_lost_rank_stops_the_others_quickly_with_a_clear_message(tmp_path, hang):
    """Without torchrun's agent to end the survivors (the ranks started by another launcher), rank 0
    stops by itself: at once when rank 1 dies, after ddp_timeout when it hangs, and says what to do."""
    import json
    import subprocess
    import sys
    import time

    from tests.train.torchrun_helpers import REPOSITORY, free_port

    options = {
        "batch": 2,
        "accumulation": 2,
        "save_strategy": "steps",
        "save_steps": 2,
        "die_at_step": 3,
        "hang": hang,
        # Short, so a hang is found quickly, yet long enough that a collective delayed by a loaded machine (another
        # test worker's ranks on the same 2 cores) is not mistaken for a lost rank.
        "ddp_timeout": 20,
    }
    port = free_port()
    ranks = []
    for rank in (0, 1):
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPOSITORY),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        ranks.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(REPOSITORY / "tests" / "train" / "fsdp_worker.py"),
                    str(tmp_path / "run"),
                    str(tmp_path / "run.json"),
                    json.dumps(options),
                ],
                env=env,
                cwd=REPOSITORY,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        started = time.monotonic()
        _, stderr = ranks[0].communicate(timeout=180)
        waited = time.monotonic() - started
    finally:
        for process in ranks:
            process.kill()
    assert ranks[0].returncode != 0
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert (
        "Process 0 of 2 lost contact with the other processes after step 3" in stderr
        and "(20 now)" in stderr
        and f"The last complete checkpoint, {checkpoint}, is intact" in stderr
    ), stderr[-3000:]
    if hang:
        assert "Timed out" in stderr  # waited ddp_timeout (20 s), not the 1800 s default
    assert waited < 170  # generous: start-up of two processes on a busy machine, plus the 20 s timeout
    assert ckpt.get_last_checkpoint(str(tmp_path / "run")) == str(checkpoint) and ckpt.is_complete_checkpoint(
        str(checkpoint)
    )
