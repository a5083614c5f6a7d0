"""OWL's approximation grouping algorithm (Algorithm 1): the largest branch goes into the smallest group.

Given the branches' parameter sizes and a number of groups D, sort the sizes in descending order and put each
into the group with the smallest sum so far (ties: the lowest group index). The paper proves the largest group
at most (3/2 - 1/(2D)) times the optimum's (Theorem 2). `all_groupings` runs it for every D = 1 .. M, as
Algorithm 1's outer loop does.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["group_branches", "all_groupings", "group_sizes"]


def group_branches(sizes: Sequence[int], num_groups: int) -> list[list[int]]:
    """Branch indices per group (each group's indices ascending); ValueError for D outside 1 .. len(sizes)."""
    m = len(sizes)
    if m == 0:
        raise ValueError("no branches to group; segment the model first")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or not 1 <= num_groups <= m:
        raise ValueError(f"num_groups={num_groups!r} must be between 1 and the number of branches ({m}); "
                         "a group with no branch would carry nothing")
    if any(s < 0 for s in sizes):
        raise ValueError(f"branch sizes {list(sizes)} must be >= 0 bytes")
    order = sorted(range(m), key=lambda i: (-sizes[i], i))
    groups: list[list[int]] = [[] for _ in range(num_groups)]
    sums = [0] * num_groups
    for i in order:
        g = min(range(num_groups), key=lambda j: (sums[j], j))
        groups[g].append(i)
        sums[g] += sizes[i]
    return [sorted(g) for g in groups]


def all_groupings(sizes: Sequence[int]) -> dict[int, list[list[int]]]:
    """Algorithm 1's output: the grouping for every number of groups D = 1 .. M."""
    return {d: group_branches(sizes, d) for d in range(1, len(sizes) + 1)}


def group_sizes(sizes: Sequence[int], groups: Sequence[Sequence[int]]) -> list[int]:
    """Bytes of each group."""
    return [int(sum(sizes[i] for i in g)) for g in groups]
