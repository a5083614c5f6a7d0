"""How far one malicious client can move a secure-aggregation mean: whole SecAgg+ rounds of the real state machines
(`SecAggClient`, `SecAggServer` with a certificate `Verifier`: signed keys, verifiable shares, public signed weights,
the range check of the unmasked sum), one attacker among them.

One combiner's round of `--clients` clients with `--params` parameters: honest updates are N(0, 0.3·clip_range)
except coordinate 0, where every honest client sits at −clip_range (clipped from −2·clip_range: the worst case for
a shift upward); num_examples n_i drawn from [max_weight/2, 2·max_weight), so weights min(n_i, max_weight). Client
0 is the attacker, with num_examples 2·max_weight (weight max_weight). Each round runs with fresh keys and session;
the influence is the largest change of any coordinate of the decoded mean against the same round with client 0
honest, in units of what one honest client of weight max_weight can change it by (its input moved from −clip_range
to +clip_range, the first row, run as a round of its own). Attacks on client 0's masked input (masks are additive,
so a change to the masked words is the same change to the unmasked sum):

  out-of-range words        it adds 11 of those honest ranges to every word
  weight above max_weight   it claims weight 2·max_weight, signed with its own certificate
  in-range worst case       knowing the others' sum (the worst case), it places every coordinate of the sum at the
                            edge of the range check, +Σ B_i: the most any client can do unseen

    .venv/bin/python benchmarks/secagg_influence.py --clients 10 --params 10000
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from nebula.federated.secagg import (MaskedInput, SecAggClient, SecAggConfig, SecAggRefused,  # noqa: E402
                                     SecAggServer, load_signer, load_verifier)
from nebula.federated.secagg.client import weight_statement  # noqa: E402

OUT_OF_RANGE = 11  # the attacker's shift, in honest ranges
FEDERATION = "bench"


def credentials(names: list[str], d: Path):
    """A throwaway federation CA, a worker certificate per client (named as its rank), and their verifier."""
    from security.ca import CertificateAuthority

    ca = CertificateAuthority.init(d / "ca", FEDERATION)
    signers = {}
    for c in names:
        cluster, _, rank = c.partition("/")
        ca.issue(f"client-{rank}", "worker", cluster, out_dir=d / "certs", stem=f"{cluster}-{rank}")
        signers[c] = load_signer(d / "certs" / f"{cluster}-{rank}.pem", d / "certs" / f"{cluster}-{rank}.key")
    return signers, lambda: load_verifier(ca.cert_path, ca.write_crl(), FEDERATION,
                                          lambda c: f"client-{c.partition('/')[2]}")


def secure_round(cfg: SecAggConfig, names: list[str], xs: np.ndarray, ns: list[int], signers, verifier,
                 tamper: Callable[[SecAggClient, MaskedInput], MaskedInput] | None = None, round_: int = 1,
                 word_bits: int = 32):
    """One round of the state machines on `word_bits`-bit words; `tamper` rewrites client 0's masked input.
    (mean or None, why refused, the round's parameters)."""
    params = cfg.round_params(round_, names, xs.shape[1], os.urandom(16), word_bits)
    srv = SecAggServer(params, verifier())
    cl = {c: SecAggClient(c, params, signers[c], verifier()) for c in names}
    for c in names:
        srv.receive_keys(cl[c].advertise())
    for c, r in srv.rosters().items():
        srv.receive_shares(cl[c].share_keys(r))
    for c, dv in srv.deliveries().items():
        srv.receive_check(cl[c].check_shares(dv))
    refused = None
    for c, v in srv.verdicts().items():
        m = cl[c].mask(v, xs[names.index(c)], ns[names.index(c)])
        if c == names[0] and tamper is not None:
            m = tamper(cl[c], m)
        try:
            srv.receive_masked(m)
        except SecAggRefused as exc:
            refused = str(exc)
    for c, ss in srv.survivor_sets().items():
        srv.receive_signature(cl[c].sign_survivors(ss))
    for c, rq in srv.unmask_requests().items():
        srv.receive_unmask(cl[c].unmask(rq))
    try:
        s = srv.result()
    except SecAggRefused as exc:
        return None, str(exc), params
    return s.vector * (s.max_weight / s.num_examples), refused, params


def run(n: int, d: int, clip: float, max_weight: int, word_bits: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    names = [f"A/{2 + i}" for i in range(n)]
    cfg = SecAggConfig(clip_range=clip, max_weight=max_weight, max_dropout=0.1)
    xs = rng.normal(0, 0.3 * clip, (n, d))
    xs[:, 0] = -2 * clip
    ns = [2 * max_weight] + [int(v) for v in rng.integers(max_weight // 2 or 1, 2 * max_weight, n - 1)]
    with tempfile.TemporaryDirectory(prefix="secagg-influence-") as tmp:
        signers, verifier = credentials(names, Path(tmp))
        base, why, params = secure_round(cfg, names, xs, ns, signers, verifier, word_bits=word_bits)
        assert base is not None and why is None, f"an honest round must pass: {why}"
        q = params.quantizer
        weights = [q.weight(v) for v in ns]
        signed = np.dtype(np.int32 if word_bits == 32 else np.int16)
        span = 2 * q.word_bound(max_weight)  # the most an honest full-weight client moves a coordinate, in words
        unit = span / q.scale * max_weight / sum(weights)  # the same on the mean
        others = sum(q.encode_vector(xs[i], weights[i]).view(signed).astype(np.int64) for i in range(1, n))
        own = q.encode_vector(xs[0], weights[0]).view(signed).astype(np.int64)
        mod = 1 << word_bits

        def shifted(delta: np.ndarray):
            def tamper(_, m: MaskedInput) -> MaskedInput:
                return dataclasses.replace(m, words=m.words + np.remainder(delta, mod).astype(q.dtype))
            return tamper

        def heavier(client: SecAggClient, m: MaskedInput) -> MaskedInput:
            w = 2 * max_weight  # signed for real: only the cap refuses it
            return dataclasses.replace(m, weight=w, signature=client.signer.sign(
                weight_statement(client.tag, client.client, w)))

        moved = xs.copy()
        moved[0, 0] = clip  # the honest reference: a legal move of client 0's input
        attacks = {"honest client (reference)": (moved, None),
                   "out-of-range words": (xs, shifted(np.full(d, OUT_OF_RANGE * span, np.int64))),
                   "weight above max_weight": (xs, heavier),
                   "in-range worst case": (xs, shifted(q.sum_bound(weights) - others - own))}
        rows = {}
        for r, (name, (inputs, tamper)) in enumerate(attacks.items(), start=2):
            mean, why, _ = secure_round(cfg, names, inputs, ns, signers, verifier, tamper, r, word_bits)
            if mean is None or why is not None:
                rows[name] = {"influence": None, "detected": "yes", "why": why}
            else:
                rows[name] = {"influence": float(np.abs(mean - base).max() / unit), "detected": "no", "why": None}
    return {"n": n, "d": d, "clip": clip, "max_weight": max_weight, "word_bits": word_bits, "weights": weights,
            "degree": params.effective_degree, "threshold": params.threshold, "unit": unit, "rows": rows,
            "max_influence": q.max_influence(weights), "max_influence_units": q.max_influence(weights) / unit}


def fmt(v: float | None) -> str:
    return "refused" if v is None else (f"{v:.3g}x" if v >= 1000 else f"{v:.2f}x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--params", type=int, default=10000)
    ap.add_argument("--clip-range", type=float, default=1.0)
    ap.add_argument("--max-weight", type=int, default=1000)
    ap.add_argument("--word-bits", type=int, default=32, choices=(16, 32))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.clients < 3 or a.params < 1:
        ap.error("--clients must be >= 3 (secure aggregation's minimum) and --params >= 1")
    try:
        r = run(a.clients, a.params, a.clip_range, a.max_weight, a.word_bits, a.seed)
    except ValueError as exc:  # the configuration's own one-line reason
        ap.error(str(exc))
    print(f"one malicious client's influence on a secure mean: {r['n']} clients (k = {r['degree']}, t = "
          f"{r['threshold']}), {r['d']} parameters, clip_range {r['clip']:g}, max_weight {r['max_weight']}, "
          f"{r['word_bits']}-bit words, total weight {sum(r['weights'])}")
    print("computed with: SecAggClient/SecAggServer rounds (signed keys, verifiable shares, public signed weights, "
          "the range check of the unmasked sum); client 0 attacks")
    print(f"influence unit: one honest client of weight {r['max_weight']} moving its input from -clip_range to "
          f"+clip_range, {r['unit']:.4g} on a coordinate of the mean")
    print(f"{'attack':<28}{'influence':>12}{'detected':>10}")
    for name, row in r["rows"].items():
        print(f"{name:<28}{fmt(row['influence']):>12}{row['detected']:>10}")
    for name, row in r["rows"].items():
        if row["why"]:
            print(f"{name}: {row['why']}")
    print(f"bound with the range check: max_influence = {r['max_influence']:.4g} on the mean "
          f"({r['max_influence_units']:.2f}x an honest client; {r['n']} clients)")


if __name__ == "__main__":
    main()
