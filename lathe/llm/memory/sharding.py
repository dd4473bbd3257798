"""The memory plan under several processes: which of the per-device terms each process holds whole and
which it holds a 1/world share of, and what a sharded run gathers whole while it computes. One process
(or a dry run outside a launch) holds everything: no Sharding.

- FSDP2 (`fsdp`, lathe.train.parallel.fsdp.shard_model): every block, then the root, fully_shard-ed. Weights,
  gradients and optimizer state (and its step's temporaries) are 1/world per process; dpo/kto's frozen
  reference is sharded like the policy (preference.reference.shard_reference_like_policy). While it
  computes, a process holds whole: the root's parameters (embeddings, head, final norm: the root is not
  resharded after forward), the block being computed and the next one (prefetched) or, with
  reshard_after_forward false (`shard_grad_op`), every block from its forward to its backward; in
  backward one block's and the root's unsharded gradients before they are reduce-scattered. Parameters
  are gathered in bf16/fp16 under mixed precision (MixedPrecisionPolicy), gradients reduced in fp32.
- DeepSpeed ZeRO (`deepspeed`): stage 1 shards the optimizer state, 2 also the gradients, 3 also the
  weights (gathered as FSDP2 gathers them, two blocks at a time). The reference is whole on every process.
- DDP (neither): every process holds everything, plus DDP's gradient buckets, a second gradient-sized
  copy (gradient_as_bucket_view is off).
"""

from __future__ import annotations

from dataclasses import dataclass

from lathe.llm.memory.layers import layer_index

__all__ = ["Sharding", "sharding_of", "shard_plan"]


@dataclass(frozen=True)
class Sharding:
    kind: str  # "fsdp2", "zero" or "ddp"
    world: int
    weights: bool = False
    gradients: bool = False
    optimizer: bool = False
    reference: bool = False  # the frozen reference sharded like the policy
    gathers: bool = False  # parameters are gathered whole while a block computes
    reshard_after_forward: bool = True
    zero_stage: int = 0
    offload: bool = False  # FSDP2 cpu_offload / ZeRO offload_optimizer: counted on the device all the same

    def describe(self) -> str:
        parts = [name for name in ("weights", "gradients", "optimizer") if getattr(self, name)]
        if self.kind == "ddp":
            return (
                f"DDP over {self.world} processes: each holds the whole model, gradients and optimizer state, "
                "plus DDP's gradient buckets"
            )
        what = ", ".join(part if part != "optimizer" else "optimizer state" for part in parts) or "nothing"
        name = "FSDP2" if self.kind == "fsdp2" else f"DeepSpeed ZeRO stage {self.zero_stage}"
        text = f"{name} over {self.world} processes: {what} 1/{self.world} per process"
        if self.kind == "zero":
            text += " (DeepSpeed's communication buckets and prefetch limits are not modelled)"
        if self.offload:
            text += "; offloaded to the CPU, but counted here on the device"
        return text


def sharding_of(training, world: int | None = None) -> Sharding | None:
    """The run's sharding as lathe.train sets it up (fsdp / deepspeed keys), over `world` processes
    (training.world_size unless given: a dry run plans for the processes it would launch); None for one."""
    world = int(world or training.world_size)
    if world <= 1:
        return None
    if training.fsdp:
        from lathe.train.parallel.fsdp import settings_from_args

        settings = settings_from_args(training)
        return Sharding(
            "fsdp2",
            world,
            weights=True,
            gradients=True,
            optimizer=True,
            reference=True,
            gathers=True,
            reshard_after_forward=settings.reshard_after_forward,
            offload=settings.cpu_offload,
        )
    if training.deepspeed:
        from lathe.train.parallel.deepspeed_zero import read_config, zero_stage

        config = read_config(training.deepspeed)
        stage = int(zero_stage(config) or 0)
        offload = (config.get("zero_optimization") or {}).get("offload_optimizer") or {}
        return Sharding(
            "zero",
            world,
            weights=stage >= 3,
            gradients=stage >= 2,
            optimizer=stage >= 1,
            gathers=stage >= 3,
            zero_stage=stage,
            offload=offload.get("device", "none") not in (None, "none"),
        )
    return Sharding("ddp", world)


def _share(value: int, world: int) -> int:
    return -(-value // world)


def gathered_bytes(model, sharding: Sharding, element: int | None) -> int:
    """What a process holds whole while it computes, on top of its shards: the root's parameters and two
    blocks' (all blocks' without resharding after forward), in the gathered dtype (`element` bytes under
    mixed precision, else the parameters' own), plus one block's and the root's trainable parameters'
    unsharded fp32 gradients."""
    blocks: dict[int, list[int]] = {}
    root = [0, 0]  # gathered bytes, trainable elements
    for name, param in model.named_parameters():
        size = param.numel() * (element or param.element_size())
        trainable = param.numel() if param.requires_grad else 0
        index = layer_index(name)
        target = root if index is None else blocks.setdefault(index, [0, 0])
        target[0] += size
        target[1] += trainable
    if sharding.kind == "zero":  # ZeRO-3 gathers submodule by submodule: two blocks' worth at a time
        root = [0, 0]
    sizes = sorted((block[0] for block in blocks.values()), reverse=True)
    gathered = sum(sizes) if not sharding.reshard_after_forward else sum(sizes[:2])
    largest_trainable = max((block[1] for block in blocks.values()), default=0)
    return root[0] + gathered + (root[1] + largest_trainable) * 4


def shard_plan(plan, model, sharding: Sharding | None, half: bool) -> None:
    """Divide the plan's sharded terms by the world size and set what is gathered while computing (in
    place; plan.gathered joins every phase but the optimizer step)."""
    if sharding is None:
        return
    world = sharding.world
    if sharding.weights:
        plan.weights = _share(plan.weights, world)
    if sharding.reference:
        plan.reference = _share(plan.reference, world)
    if sharding.kind == "ddp":
        plan.buckets = plan.gradients  # DDP's buckets: a second copy, filled as backward goes
    if sharding.gradients:
        plan.gradients = _share(plan.gradients, world)
    if sharding.optimizer:
        plan.optimizer = _share(plan.optimizer, world)
        plan.optimizer_step = _share(plan.optimizer_step, world)
    if sharding.gathers:
        plan.gathered = gathered_bytes(model, sharding, 2 if half else None)
    plan.notes.append(sharding.describe())
