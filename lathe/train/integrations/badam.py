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


def create_block_optimizer(base_optimizer, named_parameters: list, switch_block_every: int, start_block: int | None,
                           switch_mode: str, verbose: int):
    """Layer mode: `base_optimizer` (over every trainable parameter, in decay / no-decay groups) wrapped so
    that it steps the active block only, in float32 copies of its parameters."""
    block_optimizer = _badam("use_badam").BlockOptimizer(
        base_optimizer=base_optimizer, named_parameters_list=named_parameters, block_prefix_list=None,
        switch_block_every=switch_block_every, start_block=start_block, switch_mode=switch_mode, verbose=verbose,
    )
    block_optimizer.changes_requires_grad = True
    return block_optimizer


def create_ratio_optimizer(param_groups: list, named_parameters: list, update_ratio: float, mask_mode: str,
                           verbose: int, lr: float, betas: tuple[float, float], eps: float):
    """Ratio mode: a sparse Adam over `param_groups`; the embedding and output head are frozen, as BAdam does."""
    ratio_optimizer = _badam("use_badam with badam_mode: ratio").BlockOptimizerRatio(
        param_groups=param_groups, named_parameters_list=named_parameters, update_ratio=update_ratio,
        mask_mode=mask_mode, verbose=verbose, include_embedding=False, lr=lr, betas=betas, eps=eps,
    )
    ratio_optimizer.sparse_gradients = True  # its hooks make every gradient sparse: clipping must know
    return ratio_optimizer
