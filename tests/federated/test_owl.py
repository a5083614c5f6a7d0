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
    """The optimum's largest group over every partition of the branches into exactly d groups."""
    return min(max(sum(sizes[i] for i in g) for g in p) for p in _set_partitions(list(range(len(sizes))))
               if len(p) == d)


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


def test_overlapped_forward_runs_segments_in_arrival_order_and_matches_the_model():
    import numpy as np
    import paddle
    import paddle.nn as nn

    from nebula.federated.owl.model import OverlappedForward, Parallel, graph_of, model_branches

    paddle.seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Parallel(nn.Sequential(nn.ReLU(), nn.Linear(8, 3)), nn.Linear(8, 2),
                                                    nn.Linear(8, 5)), nn.Linear(10, 2))
    nodes, edges, sizes = graph_of(model)
    assert sizes["1.branches.0.0"] == 0 and sizes["1.branches.0.1"] == (8 * 3 + 3) * 4
    branches, keys = model_branches(model)
    assert [b.layers for b in branches] == [("0",), ("1.branches.0.0", "1.branches.0.1"), ("1.branches.1",),
                                            ("1.branches.2",), ("1", "2")]
    assert keys["1.branches.0.1.weight"] == 1 and keys["2.weight"] == 4
    x = paddle.randn([3, 4])
    want = model(x).numpy()
    arrived: set[int] = set()
    arrivals = iter([[0], [3], [2], [1, 4]])  # groups as they come off the wire
    fwd = OverlappedForward(model, branches)
    got = fwd.run(x, arrived, lambda: arrived.update(next(arrivals))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # the branches ran as their parameters arrived: 0, then tower 2, then tower 1, then tower 0 and the head
    assert [b for _, b in fwd.order] == [0, 3, 2, 1, 4]
    with pytest.raises(ValueError, match="nn.Sequential"):
        graph_of(nn.Linear(2, 2))


def test_deploy_setting_for_owl_and_server_only_and_too_many_groups():
    from nebula.federated.owl.config import OwlSpec
    from nebula.federated.owl.deploy import deploy_setting_for

    sizes = [40, 30, 20, 10]
    owl = deploy_setting_for(sizes, 4, OwlSpec(num_groups=2))
    assert len(owl.groups) == 2 and len(owl.from_server()) == 2
    srv = deploy_setting_for(sizes, 4, OwlSpec(num_groups=2, distribution="server"))
    assert srv.groups == owl.groups and len(srv.from_server()) == 8  # every group to every worker
    chosen = deploy_setting_for(sizes, 3, OwlSpec(server_bytes_per_s=1.0, peer_bytes_per_s=100.0))
    assert 1 <= len(chosen.groups) <= 3
    with pytest.raises(ValueError, match="3 groups for 2 workers"):
        deploy_setting_for(sizes, 2, OwlSpec(num_groups=3))
    with pytest.raises(ValueError, match="between 1 and the number of branches \\(4\\)"):
        deploy_setting_for(sizes, 8, OwlSpec(num_groups=5))
    with pytest.raises(ValueError, match="distribution='p2p' must be 'owl' or 'server'"):
        OwlSpec(distribution="p2p")


def test_deploy_setting_for_several_clusters_keeps_peer_traffic_inside_each_cluster():
    from nebula.federated.owl.config import OwlSpec
    from nebula.federated.owl.deploy import deploy_setting_for

    clusters = ["A", "B", "B", "A", "B"]
    s = deploy_setting_for([40, 30, 20, 10], clusters, OwlSpec(num_groups=2))
    # each group leaves the server once per cluster
    assert sorted(s.from_server()) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    for w, ps in enumerate(s.pulls):
        assert sorted(p.group for p in ps) == [0, 1]
        for p in ps:
            if p.source != SERVER:
                assert clusters[p.source] == clusters[w]  # the cluster-local path only
                assert s.pulls[p.source][0].group == p.group
    with pytest.raises(ValueError, match="2 groups for 1 workers"):
        deploy_setting_for([40, 30], ["A", "B", "B"], OwlSpec(num_groups=2))
