"""BAdam (block coordinate descent with Adam, Luo et al. 2024) from the badam package (lazy import).

Layer mode trains one block of layers at a time: the wrapper flips `requires_grad` so that only the
active block gets gradients and switches blocks every `switch_block_every` steps (clearing the Adam
state); it marks itself with `changes_requires_grad` so the Trainer re-reads which parameters to clip.
Ratio mode keeps every layer trainable but updates a sliding `update_ratio` share of each matrix,
with sparse gradients (clipping then needs the sparse-aware norm in lathe.train.runtime).
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'lathe[badam]'  (or: pip install badam)"


def _badam(who: str):
    try:
        import badam
    except ImportError as error:
        raise ImportError(f"{who} needs the badam package: {INSTALL_HINT}") from error
    return badam


def create_block_optimizer(
    base_optimizer,
    named_parameters: list,
    switch_block_every: int,
    start_block: int | None,
    switch_mode: str,
    verbose: int,
):
    """Layer mode: `base_optimizer` (over every trainable parameter, in decay / no-decay groups) wrapped so
    that it steps the active block only, in float32 copies of its parameters."""
    block_optimizer = _badam("use_badam").BlockOptimizer(
        base_optimizer=base_optimizer,
        named_parameters_list=named_parameters,
        block_prefix_list=None,
        switch_block_every=switch_block_every,
        start_block=start_block,
        switch_mode=switch_mode,
        verbose=verbose,
    )
    block_optimizer.changes_requires_grad = True
    _make_resumable(block_optimizer)
    return block_optimizer


def _make_resumable(block_optimizer) -> None:
    """BAdam's own state_dict is the inner optimizer's alone: a resumed run would restart at the first block,
    with float32 copies taken from the weights before the checkpoint was loaded. Here the checkpoint also
    records which block is active, which comes next (and the random order's rest), the step count and the
    learning rates of the groups the scheduler drives; loading re-activates that block from the loaded weights
    before its Adam state is restored."""
    base = block_optimizer.base_optimizer

    def active_block() -> int:
        own = len(block_optimizer.active_param_prefixs) - len(block_optimizer.active_modules)
        return block_optimizer.block_prefix_list.index(block_optimizer.active_param_prefixs[:own])

    def state_dict() -> dict:
        state = base.state_dict()
        order = getattr(block_optimizer, "block_order", None)
        # The outer groups are the ones the LR scheduler drives; their rates are copied in at each step.
        outer = [
            {key: value for key, value in group.items() if key != "params"} for group in block_optimizer.param_groups
        ]
        state["badam"] = {
            "active_block": active_block(),
            "next_block": block_optimizer.current_block_idx,
            "block_order": list(order) if order is not None else None,
            "global_step": block_optimizer.global_step,
            "outer_groups": outer,
        }
        return state

    def load_state_dict(state: dict) -> None:
        state = dict(state)
        position = state.pop("badam", None)
        if position is not None:
            block_optimizer.current_block_idx = position["active_block"]
            block_optimizer.switch_trainable_params(verbose=block_optimizer.verbose)
            block_optimizer.current_block_idx = position["next_block"]
            if position["block_order"] is not None:
                block_optimizer.block_order = list(position["block_order"])
            block_optimizer.global_step = position["global_step"]
            for group, saved in zip(block_optimizer.param_groups, position["outer_groups"]):
                group.update(saved)
        base.load_state_dict(state)

    block_optimizer.state_dict = state_dict
    block_optimizer.load_state_dict = load_state_dict


def create_ratio_optimizer(
    param_groups: list,
    named_parameters: list,
    update_ratio: float,
    mask_mode: str,
    verbose: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
):
    """Ratio mode: a sparse Adam over `param_groups`; the embedding and output head are frozen, as BAdam does."""
    ratio_optimizer = _badam("use_badam with badam_mode: ratio").BlockOptimizerRatio(
        param_groups=param_groups,
        named_parameters_list=named_parameters,
        update_ratio=update_ratio,
        mask_mode=mask_mode,
        verbose=verbose,
        include_embedding=False,
        lr=lr,
        betas=betas,
        eps=eps,
    )
    ratio_optimizer.sparse_gradients = True  # its hooks make every gradient sparse: clipping must know
    return ratio_optimizer
