"""Fixtures shared by tests/train modules."""

from __future__ import annotations

import pytest

from tests.train.torchrun_helpers import torchrun_runs

FSDP_OPTIONS = {
    "batch": 2,
    "accumulation": 2,
    "fsdp": "full_shard",
    "fsdp_config": {"activation_checkpointing": True},
    "save_strategy": "steps",
    "save_steps": 2,
}
CHUNKED = {"accumulation": 2, "tied": True, "optim": "sgd", "batch": 2, "chunked": "yes", "chunk_size": 5}


@pytest.fixture(scope="session")
def fsdp_ranks(tmp_path_factory):
    """Every 2-rank run of fsdp_worker.py the FSDP and chunked-loss tests compare, in ONE torchrun launch (in
    order: the resume reads the sharded run's checkpoint): the folder they wrote and rank 0's results."""
    folder = tmp_path_factory.mktemp("fsdp")
    runs = {
        "sharded": FSDP_OPTIONS,
        # resumed with the parameters offloaded to CPU between uses (cpu_offload)
        "resumed": {**FSDP_OPTIONS, "fsdp": "full_shard offload", "resume": str(folder / "sharded" / "checkpoint-2")},
        "tied": {"batch": 2, "accumulation": 2, "tied": True, "optim": "sgd", "fsdp": "full_shard auto_wrap"},
        "chunked_ddp": {**CHUNKED, "fsdp": None},
        "chunked_fsdp": {**CHUNKED, "fsdp": "full_shard auto_wrap"},
    }
    return folder, torchrun_runs(folder, runs)
