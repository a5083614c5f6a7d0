"""SecAgg+ protocol cost per round against plain summation: compute time and bytes per client, server time.

Runs the pure protocol (nebula.federated.secagg) for every client of one combiner in this process, with a
`--params`-parameter update and `--dropout` of the clients vanishing after sharing keys (the costly case: the
server rebuilds their mask keys and strips their pairwise masks from each surviving neighbour's input). Plain
summation is the combiner adding the survivors' float32 updates. Times are side by side in one run on this
machine; clients run in parallel in a real round, so the protocol's share of a round is about one client's time
plus the server's. Bytes are payload (keys, sealed shares, words, shares), not framing; the global model's
download is the same for both and left out.

    python benchmarks/secagg.py --clients 100 500 --params 1000000 --dropout 0.1
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nebula.federated.secagg import SecAggClient, SecAggConfig, SecAggServer  # noqa: E402


def measure(n: int, d: int, dropout: float, seed: int = 0) -> dict:
    """One round of `n` clients with `d` parameters; a fraction `dropout` drops after sharing keys."""
    rng = np.random.default_rng(seed)
    names = [f"client-{i:04d}" for i in range(n)]
    params = SecAggConfig(clip_range=0.1, max_weight=1000, max_dropout=dropout).round_params(
        1, names, d, os.urandom(16))
    gone = set(rng.choice(names, round(dropout * n), replace=False))
    srv = SecAggServer(params)
    cl = {c: SecAggClient(c, params) for c in names}
    ct = {c: 0.0 for c in names}  # each client's compute time
    up = {c: 0 for c in names}
    down = {c: 0 for c in names}
    st = 0.0

    def client(c, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        ct[c] += time.perf_counter() - t0
        return out

    def server(fn, *args):
        nonlocal st
        t0 = time.perf_counter()
        out = fn(*args)
        st += time.perf_counter() - t0
        return out

    for c in names:
        m = client(c, cl[c].advertise)
        up[c] += m.payload_bytes
        server(srv.receive_keys, m)
    for c, r in server(srv.rosters).items():
        down[c] += r.payload_bytes
        m = client(c, cl[c].share_keys, r)
        up[c] += m.payload_bytes
        server(srv.receive_shares, m)
    for c, dv in server(srv.deliveries).items():
        down[c] += dv.payload_bytes
        if c in gone:
            continue
        x = rng.normal(0, 0.01, d).astype(np.float32)
        m = client(c, cl[c].mask, dv, x, int(rng.integers(1, 1000)))
        up[c] += m.payload_bytes
        server(srv.receive_masked, m)
    for c, rq in server(srv.unmask_requests).items():
        m = client(c, cl[c].unmask, rq)
        up[c] += m.payload_bytes
        server(srv.receive_unmask, m)
    result = server(srv.result)
    survivors = [c for c in names if c not in gone]
    # plain FedAvg at the combiner: add the survivors' float32 updates (weighted), one at a time
    xs = [rng.normal(0, 0.01, d).astype(np.float32) for _ in range(8)]
    t0 = time.perf_counter()
    acc = np.zeros(d, np.float64)
    for i, _ in enumerate(survivors):
        acc += xs[i % len(xs)] * 0.5
    plain = time.perf_counter() - t0
    times = [ct[c] for c in survivors]
    return {"n": n, "degree": params.degree, "threshold": params.threshold, "dropped": len(result.dropped),
            "client_mean": statistics.mean(times), "client_max": max(times), "server": st, "plain_server": plain,
            "up": statistics.mean(up[c] for c in survivors), "down": statistics.mean(down[c] for c in survivors),
            "plain_up": 4 * d}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 500])
    ap.add_argument("--params", type=int, default=1_000_000)
    ap.add_argument("--dropout", type=float, default=0.1)
    a = ap.parse_args()
    print(f"SecAgg+ vs plain summation: {a.params:,} parameters, {a.dropout:.0%} of clients drop after sharing keys")
    print(f"{'clients':>7} {'k':>4} {'t':>4} {'client s':>9} {'max s':>7} {'server s':>9} {'plain s':>8} "
          f"{'compute x':>9} {'up MB':>7} {'down KB':>8} {'up x':>6}")
    for n in a.clients:
        r = measure(n, a.params, a.dropout)
        ratio = (r["client_max"] + r["server"]) / r["plain_server"]
        print(f"{r['n']:>7} {r['degree']:>4} {r['threshold']:>4} {r['client_mean']:>9.3f} {r['client_max']:>7.3f} "
              f"{r['server']:>9.2f} {r['plain_server']:>8.3f} {ratio:>9.1f} {r['up'] / 1e6:>7.3f} "
              f"{r['down'] / 1e3:>8.1f} {r['up'] / r['plain_up']:>6.3f}")
    print("client s: one survivor's protocol compute (mean, max); server s: the combiner's; plain s: adding the "
          "survivors' float32 updates;\ncompute x: (client max + server) / plain, protocol compute only (no training, "
          "no network); up x: bytes a client sends / a float32 update's")


if __name__ == "__main__":
    main()
