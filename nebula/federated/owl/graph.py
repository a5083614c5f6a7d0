"""Segments of a model's graph (OWL §2.1, Definitions 1-3): bases in sequence, each a set of branches.

A node lies in a *linear* base when every path from the inputs to the outputs passes through it; the nodes
between two such cut nodes form a *nonlinear* base whose branches are the maximal chains among them (Definition
1: a branch's inner layers link only to each other). A linear model is one base with one branch; a two-tower or
multi-head model has a base with one branch per tower or head. A graph with a cycle is refused.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["Branch", "Base", "GraphError", "segments", "topo_order"]


class GraphError(ValueError):
    """The graph cannot be segmented (a cycle, an unknown node, a duplicate)."""


@dataclass(frozen=True, slots=True)
class Branch:
    """A chain of layers (node names, in order) and the bytes of its parameters."""

    layers: tuple[str, ...]
    nbytes: int


@dataclass(frozen=True, slots=True)
class Base:
    """A base network: one branch (linear) or several parallel ones (nonlinear)."""

    branches: tuple[Branch, ...]

    @property
    def linear(self) -> bool:
        """True for a base of one branch."""
        return len(self.branches) == 1


def topo_order(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[str]:
    """Kahn's order (ties in the order `nodes` gives); GraphError naming the nodes of a cycle."""
    if len(set(nodes)) != len(nodes):
        raise GraphError(f"node names repeat in {list(nodes)}; name every layer once")
    known = set(nodes)
    succ: dict[str, list[str]] = defaultdict(list)
    indeg = {n: 0 for n in nodes}
    for u, v in edges:
        for x in (u, v):
            if x not in known:
                raise GraphError(f"edge ({u!r}, {v!r}) names unknown layer {x!r}; known: {sorted(known)}")
        succ[u].append(v)
        indeg[v] += 1
    rank = {n: i for i, n in enumerate(nodes)}
    ready = sorted((n for n in nodes if indeg[n] == 0), key=rank.get)
    out = []
    while ready:
        n = ready.pop(0)
        out.append(n)
        for v in succ[n]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
                ready.sort(key=rank.get)
    if len(out) != len(nodes):
        stuck = [n for n in nodes if indeg[n] > 0]
        raise GraphError(f"the model's graph has a cycle through {stuck}; OWL segments only acyclic graphs "
                         "(unroll recurrent layers into one node)")
    return out


def segments(nodes: Sequence[str], edges: Sequence[tuple[str, str]], sizes: Mapping[str, int]) -> list[Base]:
    """The bases (in forward order) of the graph, each with its branches and their parameter bytes."""
    order = topo_order(nodes, edges)
    if not order:
        raise GraphError("the model's graph is empty")
    pos = {n: i for i, n in enumerate(order)}
    succ: dict[str, list[str]] = defaultdict(list)
    pred: dict[str, list[str]] = defaultdict(list)
    for u, v in edges:
        succ[u].append(v)
        pred[v].append(u)
    # virtual input (-1) feeding every source and virtual output (len) fed by every sink
    spans = [(pos[u], pos[v]) for u, v in edges]
    spans += [(-1, pos[n]) for n in order if not pred[n]] + [(pos[n], len(order)) for n in order if not succ[n]]
    jumped = [0] * (len(order) + 1)
    for a, b in spans:  # mark positions strictly between a and b
        if b - a > 1:
            jumped[a + 1] += 1
            jumped[b] -= 1
    cut, running = [], 0
    for i in range(len(order)):
        running += jumped[i]
        cut.append(running == 0)

    def size(chain: list[str]) -> int:
        return int(sum(int(sizes.get(n, 0)) for n in chain))

    bases: list[Base] = []
    i = 0
    while i < len(order):
        if cut[i]:
            chain = []
            while i < len(order) and cut[i]:
                chain.append(order[i])
                i += 1
            bases.append(Base((Branch(tuple(chain), size(chain)),)))
            continue
        block = []
        while i < len(order) and not cut[i]:
            block.append(order[i])
            i += 1
        inside = set(block)
        s_in = {n: [v for v in succ[n] if v in inside] for n in block}
        p_in = {n: [u for u in pred[n] if u in inside] for n in block}
        branches, seen = [], set()
        for n in block:  # a chain starts where a node does not continue its single predecessor's chain
            if n in seen:
                continue
            if len(p_in[n]) == 1 and len(s_in[p_in[n][0]]) == 1:
                continue  # picked up from its predecessor
            chain = [n]
            seen.add(n)
            while len(s_in[chain[-1]]) == 1 and len(p_in[s_in[chain[-1]][0]]) == 1:
                chain.append(s_in[chain[-1]][0])
                seen.add(chain[-1])
            branches.append(Branch(tuple(chain), size(chain)))
        bases.append(Base(tuple(branches)))
    return bases
