"""Several nodes: whether the nodes of a job share its output_dir, checked once before training when
save_on_each_node=True, because that setting makes every node's first process write the same
checkpoint files and the nodes would race each other for them on a shared disk."""

from __future__ import annotations

import os
import uuid

from lathe.train.parallel import distributed


def node_count() -> int:
    """How many nodes the launcher spread the job over (WORLD_SIZE / LOCAL_WORLD_SIZE, torchrun's)."""
    world = distributed.world_size()
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        local = world
    return max(world // max(local, 1), 1)


def check_separate_disks(args) -> None:
    """With save_on_each_node=True on several nodes, every node's local main process saves each
    checkpoint (transformers' meaning): right when each node has its own disk, a race for the same
    files when they share one. The job's first process leaves a marker in output_dir; if another
    node's first process sees it, every process raises the same clear error before training."""
    if not args.save_on_each_node or not distributed.is_distributed() or node_count() <= 1:
        return
    import torch.distributed as dist

    token = distributed.gather_objects(uuid.uuid4().hex)[0]
    marker = os.path.join(args.output_dir, f".lathe-node-marker-{token}")
    if dist.get_rank() == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(marker, "w") as handle:
            handle.write("written by the job's first process to find out whether the nodes share this folder\n")
    dist.barrier()
    shared = args.local_process_index == 0 and dist.get_rank() != 0 and os.path.exists(marker)
    seen = distributed.gather_objects(shared)
    if dist.get_rank() == 0:
        os.remove(marker)
    if any(seen):
        raise ValueError(
            f"save_on_each_node=True, but the {node_count()} nodes share output_dir {args.output_dir!r}: every node "
            "would write the same checkpoint files at once. Keep save_on_each_node=False (the default: only the "
            "job's first process saves) on a shared filesystem; True is for nodes with a disk each."
        )
