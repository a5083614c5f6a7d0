"""Which example ids each rank and micro-batch processes: a pure function of (seed, step), shared by all clusters."""
from __future__ import annotations

import numpy as np

__all__ = ["step_ids", "rank_micro_batches"]


def step_ids(step: int, *, seed: int, num_examples: int, global_batch: int) -> np.ndarray:
    """The `global_batch` example ids of optimizer step `step`: epochs walk a seeded permutation of 0..n-1."""
    if num_examples < 1 or global_batch < 1 or step < 0:
        raise ValueError(f"step_ids: need step >= 0, num_examples >= 1, global_batch >= 1; got {step}, "
                         f"{num_examples}, {global_batch}")
    pos = np.arange(step * global_batch, (step + 1) * global_batch, dtype=np.int64)
    epochs = pos // num_examples
    out = np.empty_like(pos)
    for e in np.unique(epochs):
        perm = np.random.default_rng((seed, int(e))).permutation(num_examples)
        sel = epochs == e
        out[sel] = perm[pos[sel] % num_examples]
    return out


def rank_micro_batches(ids: np.ndarray, *, rank: int, world_size: int, micro_batches: int) -> list[np.ndarray]:
    """Split a step's ids over ranks (contiguous blocks) and then into equal micro-batches for `rank`."""
    n = len(ids)
    if n % (world_size * micro_batches):
        raise ValueError(f"{n} examples do not split evenly over {world_size} ranks x {micro_batches} micro-batches")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
    per_rank = n // world_size
    mine = ids[rank * per_rank:(rank + 1) * per_rank]
    return list(np.split(mine, micro_batches))
