"""OWL's pure parts: segments of a graph (against path enumeration), grouping and deploying against brute force."""
from __future__ import annotations

import itertools
import random

import pytest

from nebula.federated.owl import (SERVER, GraphError, centralized, deploy, estimate_round_s, group_branches,
                                  group_sizes, segments, server_only_round_s)


def test_inception_base_of_the_paper_has_four_branches():
    nodes = [f"l{i}" for i in range(1, 11)]
    edges = [("l1", "l2"), ("l2", "l3"), ("l1", "l4"), ("l1", "l5"), ("l5", "l6"), ("l1", "l7"), ("l7", "l8"),
             ("l8", "l9"), ("l3", "l10"), ("l4", "l10"), ("l6", "l10"), ("l9", "l10")]
    sizes = {n: i for i, n in enumerate(nodes)}
    bases = segments(nodes, edges, sizes)
    assert [b.linear for b in bases] == [True, False, True]
    assert [br.layers for br in bases[1].branches] == [("l2", "l3"), ("l4",), ("l5", "l6"), ("l7", "l8", "l9")]
    assert [br.nbytes for br in bases[1].branches] == [1 + 2, 3, 4 + 5, 6 + 7 + 8]


def test_linear_model_is_one_branch_and_two_tower_has_two():
    assert [[b.layers for b in base.branches] for base in segments(["a", "b", "c"], [("a", "b"), ("b", "c")], {})] \
        == [[("a", "b", "c")]]
    nodes = ["u1", "u2", "i1", "i2", "join", "head"]
    edges = [("u1", "u2"), ("i1", "i2"), ("u2", "join"), ("i2", "join"), ("join", "head")]
    bases = segments(nodes, edges, {})
    assert [[b.layers for b in base.branches] for base in bases] == [[("u1", "u2"), ("i1", "i2")], [("join", "head")]]
    # multi-head: a trunk, then three heads (outputs)
    nodes = ["t", "h1", "h2", "h3a", "h3b"]
    edges = [("t", "h1"), ("t", "h2"), ("t", "h3a"), ("h3a", "h3b")]
    assert [[b.layers for b in base.branches] for base in segments(nodes, edges, {})] == \
        [[("t",)], [("h1",), ("h2",), ("h3a", "h3b")]]


def test_cycle_and_unknown_layer_are_refused():
    with pytest.raises(GraphError, match="cycle through .*'b'.*unroll"):
        segments(["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "b")], {})
    with pytest.raises(GraphError, match="unknown layer 'z'"):
        segments(["a"], [("a", "z")], {})


def _paths(nodes, edges):
    succ = {n: [v for u, v in edges if u == n] for n in nodes}
    srcs = [n for n in nodes if not any(v == n for _, v in edges)]
    out = []

    def walk(p):
        if not succ[p[-1]]:
            out.append(p)
        for v in succ[p[-1]]:
            walk(p + [v])
    for s in srcs:
        walk([s])
    return out


@pytest.mark.parametrize("seed", range(30))
def test_linear_bases_are_exactly_the_nodes_on_every_path(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    nodes = [f"n{i}" for i in range(n)]
    edges = [(nodes[i], nodes[j]) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.35]
    bases = segments(nodes, edges, {})
    paths = _paths(nodes, edges)
    on_all = {x for x in nodes if all(x in p for p in paths)}
    in_linear = {x for b in bases if b.linear for x in b.branches[0].layers}
    # a nonlinear base of one chain cannot exist; a linear base holds only nodes every path passes
    assert in_linear == on_all
    flat = [x for b in bases for br in b.branches for x in br.layers]
    assert sorted(flat) == sorted(nodes)  # Eq. (1) and (2): every layer in exactly one branch
    for b in bases:
        for br in b.branches:  # a branch is a chain of links
            assert all((br.layers[i], br.layers[i + 1]) in edges for i in range(len(br.layers) - 1))


def test_grouping_hand_worked():
    assert group_branches([7, 5, 4, 3, 3, 2], 2) == [[0, 3, 5], [1, 2, 4]]
    assert group_sizes([7, 5, 4, 3, 3, 2], [[0, 3, 5], [1, 2, 4]]) == [12, 12]
    assert group_branches([1, 1, 1], 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="between 1 and the number of branches"):
        group_branches([1, 2], 3)


def _brute_max_group(sizes, d):
    best = None
    for assign in itertools.product(range(d), repeat=len(sizes)):
        if len(set(assign)) < d:
            continue
        m = max(sum(s for s, a in zip(sizes, assign) if a == g) for g in range(d))
        best = m if best is None else min(best, m)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_grouping_within_the_papers_bound_of_brute_force(seed):
    rng = random.Random(seed)
    sizes = [rng.randint(1, 100) for _ in range(rng.randint(2, 7))]
    for d in range(1, len(sizes) + 1):
        got = max(group_sizes(sizes, group_branches(sizes, d)))
        opt = _brute_max_group(sizes, d)
        assert opt <= got <= (1.5 - 1 / (2 * d)) * opt + 1e-9


def test_centralized_setting_server_sends_the_model_once_and_peers_have_groups_first():
    s = centralized(5, [[0, 1], [2], [3]])
    assert sorted(s.from_server()) == [(0, 0), (1, 1), (2, 2)]  # each group once, to its central worker
    for w, ps in enumerate(s.pulls):
        assert sorted(p.group for p in ps) == [0, 1, 2]  # Eq. (8): every worker gets every group
        for p in ps:
            if p.source != SERVER:  # Eq. (9): the peer's first pull is that group
                assert s.pulls[p.source][0].group == p.group
    with pytest.raises(ValueError, match="3 groups for 2 workers.*at most 2 groups"):
        centralized(2, [[0], [1], [2]])


def _set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


@pytest.mark.parametrize("seed", range(12))
def test_deploying_against_brute_force_over_all_groupings(seed):
    rng = random.Random(100 + seed)
    m, n = rng.randint(2, 6), rng.randint(1, 5)
    sizes = [rng.randint(1, 50) for _ in range(m)]
    comp = [rng.uniform(0.0, 10.0) for _ in range(m)]
    sbw, pbw = 1.0, rng.choice([1.0, 4.0])
    setting, times = deploy(sizes, n, compute_s=comp, server_bytes_per_s=sbw, peer_bytes_per_s=pbw)
    assert set(times) == set(range(1, min(n, m) + 1))
    assert times[len(setting.groups)] == min(times.values())  # Algorithm 2 keeps the fastest D

    def cost(groups):
        s = centralized(n, groups)
        return estimate_round_s(s, group_sizes(sizes, groups), [sum(comp[i] for i in g) for g in groups], sbw, pbw)

    # every grouping, in every order of its groups (the order decides which worker pulls which from the server)
    opt = min(cost(list(q)) for p in _set_partitions(list(range(m))) if len(p) <= n
              for q in itertools.permutations(p))
    got = times[len(setting.groups)]
    assert opt <= got + 1e-9 and got <= 1.5 * opt + 1e-9
    # and never slower than the server sending the whole model to every worker
    assert got <= server_only_round_s(n, sum(sizes), sum(comp), sbw) + 1e-9
