"""Where each rank of a cluster sits in a hybrid layout: `num_stages` pipeline stages x `num_replicas` replicas.

Ranks of one replica are consecutive (rank = replica * num_stages + stage), as in Paddle fleet's pipe-inside-data
order, so a replica's pipeline neighbours are adjacent ranks and the replicas of a stage are `num_stages` apart.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Layout", "shrink_layout"]


@dataclass(frozen=True, slots=True)
class Layout:
    """A hybrid DP x PP arrangement of `num_stages * num_replicas` ranks."""

    num_stages: int
    num_replicas: int

    def __post_init__(self) -> None:
        if self.num_stages < 1 or self.num_replicas < 1:
            raise ValueError(f"layout {self.num_stages} stages x {self.num_replicas} replicas: both must be >= 1")

    @property
    def world_size(self) -> int:
        """Ranks the layout needs."""
        return self.num_stages * self.num_replicas

    def stage_of(self, rank: int) -> int:
        """Pipeline stage of `rank`."""
        return rank % self.num_stages

    def replica_of(self, rank: int) -> int:
        """Data-parallel replica (pipeline copy) of `rank`."""
        return rank // self.num_stages

    def rank_of(self, stage: int, replica: int) -> int:
        """The rank running `stage` in `replica`."""
        return replica * self.num_stages + stage

    def stage_ranks(self, stage: int) -> list[int]:
        """The replicas of `stage`: they all-reduce its gradients."""
        return [self.rank_of(stage, r) for r in range(self.num_replicas)]


def shrink_layout(old: Layout, world_size: int, num_layers: int) -> Layout:
    """The layout for `world_size` ranks after ranks left or joined: keep the stage count if the ranks still split
    into equal replicas of it, else one pipeline over all ranks (at most one stage per layer)."""
    if world_size < 1:
        raise ValueError(f"no ranks left (world_size={world_size}); start the job again with at least one rank")
    if world_size % old.num_stages == 0 and old.num_stages <= num_layers:
        return Layout(old.num_stages, world_size // old.num_stages)
    for stages in range(min(world_size, num_layers), 0, -1):
        if world_size % stages == 0:
            return Layout(stages, world_size // stages)
    return Layout(1, world_size)  # unreachable: stages=1 divides everything
