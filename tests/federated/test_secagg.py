"""SecAgg+ protocol: the unmasked sum against plain FedAvg within the stated quantisation bound, dropouts at every
stage recovered, a late masked input refused, fewer than the threshold's shares unmask nobody (an attack that
tries), and the masked words a combiner sees are uniform. Every client signs with a certificate of a real CA
(`credentials`)."""
from __future__ import annotations

import functools
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from nebula.federated.aggregate import fedavg
from nebula.federated.secagg import (SecAggClient, SecAggConfig, SecAggRefused, SecAggServer, majority_threshold,
                                     reduce_sums)
from nebula.federated.secagg import crypto, load_signer, load_verifier, shamir
from nebula.federated.secagg.client import MASK_PURPOSE, mask_sign
from nebula.federated.secagg.graph import safe_threshold

FEDERATION = "fedtest"


@functools.cache
def _ca() -> tuple[object, Path]:
    from security.ca import CertificateAuthority

    d = Path(tempfile.mkdtemp(prefix="secagg-ca-"))
    return CertificateAuthority.init(d / "ca", FEDERATION), d


@functools.cache
def signer_of(client: str, *, cluster: str | None = None, name: str | None = None):
    """A signer with a worker certificate of `client`'s cluster (or `cluster`), named `name` (default: its rank)."""
    ca, d = _ca()
    c, _, rank = client.partition("/")
    stem = f"{cluster or c}-{name or rank}"
    ca.issue(name or f"client-{rank}", "worker", cluster or c, out_dir=d / "certs", stem=stem)
    return load_signer(d / "certs" / f"{stem}.pem", d / "certs" / f"{stem}.key")


def verifier(named: bool = True):
    """Checks certificates against the CA and its current CRL; `named`: each client's must be `client-<rank>`."""
    ca, d = _ca()
    crl = ca.write_crl()
    return load_verifier(ca.cert_path, crl, FEDERATION,
                         (lambda c: f"client-{c.partition('/')[2]}") if named else (lambda c: None))


def make_clients(params, rb, journals=None, signers=None):
    v = verifier()
    return {c: SecAggClient(c, params, (signers or {}).get(c) or signer_of(c), v, (journals or {}).get(c), rb)
            for c in params.clients}


def seeded(seed: int):
    """Deterministic randomness for keys, seeds and shares, so every statistical assertion is reproducible."""
    r = random.Random(seed)
    return r.randbytes


def updates(n: int, d: int, seed: int, spread: float = 0.3, max_n: int = 500):
    rng = np.random.default_rng(seed)
    names = [f"A/{i + 2}" for i in range(n)]
    return names, {c: rng.normal(0, spread, d).astype(np.float32) for c in names}, \
        {c: int(rng.integers(1, max_n)) for c in names}


def run_round(params, xs, ns, *, before_keys=(), before_shares=(), after_shares=(), no_unmask=(), seed=0,
              no_sign=(), clients=None, server=None, tamper=None):
    """One round through the pure state machines; the named clients vanish at the given stage. `tamper(stage,
    client, message)` may replace a client's message ("shares", "check", "masked", "reveal") on its way."""
    rb = seeded(seed)
    srv = server or SecAggServer(params)
    cl = clients or make_clients(params, rb)
    bend = tamper or (lambda stage, c, m: m)
    for c in params.clients:
        if c not in before_keys:
            srv.receive_keys(cl[c].advertise())
    for c, r in srv.rosters().items():
        if c not in before_shares:
            srv.receive_shares(bend("shares", c, cl[c].share_keys(r)))
    for c, dv in srv.deliveries().items():
        srv.receive_check(bend("check", c, cl[c].check_shares(dv)))
    masked = {}
    for c, v in srv.verdicts().items():
        masked[c] = bend("masked", c, cl[c].mask(v, xs[c], ns[c]))
        if c not in after_shares:
            srv.receive_masked(masked[c])
    for c, ss in srv.survivor_sets().items():
        if c not in no_sign:
            srv.receive_signature(cl[c].sign_survivors(ss))
    for c, rq in srv.unmask_requests().items():
        if c not in no_unmask:
            srv.receive_unmask(bend("reveal", c, cl[c].unmask(rq)))
    return srv, cl, masked


def weighted_reference(names, xs, ns, w_cap, clip):
    return sum((min(ns[c], w_cap) / w_cap) * np.clip(xs[c].astype(np.float64), -clip, clip) for c in names)


@pytest.mark.parametrize("n", [3, 10, pytest.param(40, marks=pytest.mark.slow)])  # 40: ~10 s of share checks
def test_unmasked_sum_equals_plain_fedavg_within_the_stated_quantisation_bound(n):
    d, w_cap = 3000, 1000
    names, xs, ns = updates(n, d, seed=n)
    params = SecAggConfig(clip_range=2.0, max_weight=w_cap).round_params(1, names, d, b"s" * 16)
    srv, _, _ = run_round(params, xs, ns, seed=n)
    s = srv.result()
    q = params.quantizer
    assert s.error_bound == n / (2 * q.scale) and q.max_clients * (q.clip_range * q.scale + 0.5) <= 2 ** 31 - 1
    assert q.max_clients * (q.clip_range * 2 * q.scale + 0.5) > 2 ** 31 - 1  # the largest power of two that fits
    err = np.abs(s.vector - weighted_reference(names, xs, ns, w_cap, 2.0)).max()
    assert err <= s.error_bound and s.num_examples == sum(ns.values())
    mean, count, bound = reduce_sums([s])
    plain = fedavg([({"w": xs[c]}, ns[c]) for c in names])["w"]  # no value exceeds the clip range at 0.3 spread
    assert count == sum(ns.values())
    assert np.abs(mean - plain).max() <= bound + 1e-6  # + float32 rounding of fedavg's own result
    assert np.abs(mean - plain).max() > 0  # a real quantisation, not a pass-through


def test_stated_scale_and_bound_for_100_clients():
    from nebula.federated.secagg import Quantizer

    q = Quantizer(1.0, 100)
    assert q.scale == 2.0 ** 24 and q.error_bound(100) == pytest.approx(2.98e-6, rel=1e-3)


@pytest.mark.parametrize("frac,max_dropout", [(0.1, 0.1), (0.2, 0.3), (0.3, 0.3)])
def test_dropouts_at_every_stage_are_recovered(frac, max_dropout):
    n, d, w_cap = 24, 400, 1000
    names, xs, ns = updates(n, d, seed=7)
    params = SecAggConfig(clip_range=2.0, max_weight=w_cap, max_dropout=max_dropout).round_params(
        3, names, d, b"r" * 16)
    gone = random.Random(int(frac * 100)).sample(names, round(frac * n))
    # a third before advertising, a third after sharing keys but before masking (their pairwise masks sit in
    # their neighbours' inputs), the rest after masking (their input never arrives); one survivor never unmasks
    before_keys, after_shares, late = gone[0::3], gone[1::3], gone[2::3]
    survivors_all = [c for c in names if c not in gone]
    srv, cl, _ = run_round(params, xs, ns, before_keys=before_keys, after_shares=[*after_shares, *late],
                           no_unmask=survivors_all[:1], seed=11)
    s = srv.result()
    assert set(s.dropped) == set(after_shares) | set(late) and len(s.survivors) == n - len(gone)
    ref = weighted_reference(s.survivors, xs, ns, w_cap, 2.0)
    assert np.abs(s.vector - ref).max() <= s.error_bound
    assert s.num_examples == sum(min(ns[c], w_cap) for c in s.survivors)
    if params.degree < n - 1:
        assert all(len(srv.graph[c]) == params.degree for c in names)  # a sparse graph, not everyone


def test_a_client_that_drops_after_masking_and_returns_late_is_refused():
    n, d = 8, 200
    names, xs, ns = updates(n, d, seed=3)
    params = SecAggConfig(max_weight=1000).round_params(5, names, d, b"l" * 16)
    late = names[2]
    srv, cl, masked = run_round(params, xs, ns, after_shares=[late], seed=5)
    with pytest.raises(SecAggRefused) as e:
        srv.receive_masked(masked[late])  # it comes back after the unmask requests went out
    reason = str(e.value)
    assert "\n" not in reason and "round 5" in reason and repr(late) in reason and "after" in reason
    s = srv.result()
    assert late in s.dropped and late not in s.survivors
    ref = weighted_reference(s.survivors, xs, ns, 1000, 1.0)
    assert np.abs(s.vector - ref).max() <= s.error_bound


def test_the_combiner_with_fewer_than_threshold_shares_unmasks_nobody():
    n, d = 7, 20000
    names, xs, ns = updates(n, d, seed=9)
    params = SecAggConfig(max_weight=1).round_params(2, names, d, b"t" * 16)
    t = params.threshold
    assert t == safe_threshold(n - 1, 1) == 5 > majority_threshold(n - 1)  # one colluder besides the combiner
    target = names[0]
    # the protocol itself: only t − 1 survivors answer, so every seed has t − 1 shares: the server refuses
    srv, cl, masked = run_round(params, xs, ns, no_unmask=names[t - 1:], seed=1)
    with pytest.raises(SecAggRefused, match=r"4 valid shares of the self-mask seed of .* 5 are needed"):
        srv.result()
    # an attack: the combiner and t − 1 holders who collude hand over BOTH shares of the target's secrets
    holders = [c for c in names if c != target][: t - 1]
    words = masked[target].words.copy()
    q = params.quantizer

    def strip(points):
        seed = shamir.combine([(params.point(h), cl[h]._held[target][0]) for h in points])
        key = shamir.combine([(params.point(h), cl[h]._held[target][1]) for h in points])
        out = words - crypto.prg(seed, words.size, q.dtype)
        for v in names:
            if v == target:
                continue
            pk = srv.keys[v].mask_pk
            try:
                s = crypto.agree(key, pk, crypto.pair_info(MASK_PURPOSE, srv.tag, target, v))
            except ValueError:
                continue
            out = out - mask_sign(target, v) * crypto.prg(s, words.size, q.dtype).astype(np.int64)
        return out.astype(q.dtype), seed, key

    truth = q.encode_vector(xs[target], q.weight(ns[target]))
    got, seed, key = strip(holders + [names[-1]])  # control: with t shares the same code recovers the input
    assert np.array_equal(got, truth)
    got, seed, key = strip(holders)  # t − 1 shares: garbage
    assert crypto.public_key(key) != srv.keys[target].mask_pk
    assert np.mean(got == truth) < 0.01
    assert stats.kstest(got / 2.0 ** 32, "uniform").pvalue > 1e-3  # still uniform: nothing leaks


def test_the_masked_input_a_combiner_sees_is_uniform():
    n, d = 5, 65536
    names, _, ns = updates(n, d, seed=2)
    # the most structured updates there are: all zeros, and one constant
    xs = {c: np.zeros(d, np.float32) for c in names}
    xs[names[1]] = np.full(d, 0.5, np.float32)
    params = SecAggConfig(max_weight=1).round_params(1, names, d, b"u" * 16)
    _, _, masked = run_round(params, xs, ns, seed=4)
    for c in (names[0], names[1]):
        w = masked[c].words
        counts = np.bincount((w >> 24).astype(np.int64), minlength=256)  # top byte: 256 bins of 256 expected
        assert stats.chisquare(counts).pvalue > 1e-3
        assert stats.kstest(w / 2.0 ** 32, "uniform").pvalue > 1e-3
    plain = params.quantizer.encode_vector(xs[names[1]], 1)  # the same test rejects an unmasked update
    assert stats.kstest(plain / 2.0 ** 32, "uniform").pvalue < 1e-9


def test_disconnected_survivors_abandon_the_round_rather_than_reveal_partial_sums():
    n, d = 12, 50
    names, xs, ns = updates(n, d, seed=6)
    params = SecAggConfig(max_weight=1, degree=2, max_dropout=0).round_params(1, names, d, b"g" * 16)
    srv0 = SecAggServer(params)
    ring = [names[0]]
    while len(ring) < n:
        ring.append(next(v for v in sorted(srv0.graph[ring[-1]]) if v not in ring))
    cut = [ring[0], ring[n // 2]]  # two opposite clients of the ring: two groups no mask joins remain
    with pytest.raises(SecAggRefused, match=r"fall into 2 groups no mask joins \(sizes \[5, 5\]\)"):
        run_round(params, xs, ns, after_shares=cut, seed=8)


def test_reused_keystream_buffers_give_each_seed_its_own_stream():
    seeds = [bytes([i]) * 32 for i in range(4)]
    streams = crypto.Keystreams(1001, np.uint32)
    fresh = [crypto.prg(s, 1001, np.uint32) for s in seeds]
    assert len({f.tobytes() for f in fresh}) == 4
    for s, f in zip(seeds, fresh):  # each call's words are the seed's, whatever the call before wrote
        assert np.array_equal(streams.words(s), f)
    assert np.array_equal(crypto.Keystreams(7, np.uint16).words(seeds[0]), fresh[0].view(np.uint16)[:7])
