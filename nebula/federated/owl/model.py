"""Paddle models as OWL graphs: `Parallel` puts branches side by side; `graph_of` turns an nn.Sequential of
layers and Parallel blocks into nodes, edges and parameter bytes; `OverlappedForward` runs a forward pass
segment by segment as the parameters of each segment arrive."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from nebula.federated.owl.graph import Branch, segments

__all__ = ["Parallel", "graph_of", "model_branches", "owner_node", "OverlappedForward"]


def _layer_base():
    import paddle.nn as nn

    return nn.Layer


class Parallel(_layer_base()):
    """Branches that read the same input, their outputs concatenated on the last axis (or summed)."""

    def __init__(self, *branches, merge: str = "concat") -> None:
        import paddle.nn as nn

        super().__init__()
        if merge not in ("concat", "sum"):
            raise ValueError(f"Parallel merge={merge!r} must be 'concat' or 'sum'")
        if len(branches) < 2:
            raise ValueError(f"Parallel needs at least 2 branches, got {len(branches)}; use the layer directly")
        self.branches = nn.LayerList(list(branches))
        self.merge = merge

    def join(self, outs: Sequence):
        """Merge the branches' outputs."""
        import paddle

        return paddle.concat(list(outs), axis=-1) if self.merge == "concat" else paddle.add_n(list(outs))

    def forward(self, x):
        return self.join([b(x) for b in self.branches])


def _chain(prefix: str, layer) -> list[str]:
    import paddle.nn as nn

    if isinstance(layer, nn.Sequential):
        return [f"{prefix}.{name}" for name, _ in layer.named_children()]
    return [prefix]


def graph_of(model) -> tuple[list[str], list[tuple[str, str]], dict[str, int]]:
    """(nodes, edges, parameter bytes per node) of an nn.Sequential whose children are layers or Parallel blocks."""
    import paddle.nn as nn

    if not isinstance(model, nn.Sequential):
        raise ValueError(f"OWL reads the graph of an nn.Sequential (with Parallel blocks for branches), got "
                         f"{type(model).__name__}; wrap the model's layers in nn.Sequential")
    nodes: list[str] = []
    edges: list[tuple[str, str]] = []
    prev: list[str] = []
    for name, child in model.named_children():
        if isinstance(child, Parallel):
            ends = []
            for j, br in enumerate(child.branches):
                chain = _chain(f"{name}.branches.{j}", br)
                nodes += chain
                edges += [(p, chain[0]) for p in prev] + list(zip(chain, chain[1:]))
                ends.append(chain[-1])
            nodes.append(name)  # the join: no parameters
            edges += [(e, name) for e in ends]
            prev = [name]
        else:
            nodes.append(name)
            edges += [(p, name) for p in prev]
            prev = [name]
    sizes = {n: 0 for n in nodes}
    for key, p in model.state_dict().items():
        sizes[owner_node(key, nodes)] += int(np.prod(p.shape)) * p.element_size()
    return nodes, edges, sizes


def owner_node(key: str, nodes: Sequence[str]) -> str:
    """The node (longest layer path) that owns parameter `key`."""
    owner = key.rpartition(".")[0]
    best = max((n for n in nodes if owner == n or owner.startswith(n + ".")), key=len, default=None)
    if best is None:
        raise ValueError(f"parameter {key!r} belongs to no layer of the graph")
    return best


def model_branches(model) -> tuple[list[Branch], dict[str, int]]:
    """All branches of the model's bases in forward order, and each parameter key's branch index."""
    nodes, edges, sizes = graph_of(model)
    branches = [br for base in segments(nodes, edges, sizes) for br in base.branches]
    node_branch = {n: i for i, br in enumerate(branches) for n in br.layers}
    keys = {k: node_branch[owner_node(k, nodes)] for k in model.state_dict()}
    return branches, keys


class OverlappedForward:
    """Forward pass of an nn.Sequential with Parallel blocks, each segment run as soon as its branch has arrived."""

    def __init__(self, model, branches: Sequence[Branch]) -> None:
        self.model = model
        self.node_branch = {n: i for i, br in enumerate(branches) for n in br.layers}
        self.order: list[tuple[str, int | None]] = []  # (segment, branch) in the order they were computed

    def _branch_of(self, node: str) -> int | None:
        return self.node_branch.get(node)

    def run(self, x, arrived: set[int], wait: Callable[[], None]):
        """Forward `x`; `arrived` holds branch indices whose parameters are loaded, `wait()` blocks for the next."""
        self.order = []
        h = x
        for name, child in self.model.named_children():
            if isinstance(child, Parallel):
                todo = {j: self._branch_of(_chain(f"{name}.branches.{j}", br)[0])
                        for j, br in enumerate(child.branches)}
                outs: dict[int, object] = {}
                while todo:
                    ready = [j for j, b in todo.items() if b is None or b in arrived]
                    if not ready:
                        wait()
                        continue
                    for j in ready:
                        outs[j] = child.branches[j](h)
                        self.order.append((f"{name}.branches.{j}", todo.pop(j)))
                h = child.join([outs[j] for j in range(len(child.branches))])
            else:
                b = self._branch_of(name)
                while b is not None and b not in arrived:
                    wait()
                h = child(h)
                self.order.append((name, b))
        return h
