"""Secure aggregation's cost and differential privacy's accuracy, side by side with plain FedAvg in one run.

- pure: SecAgg+ protocol cost per round against plain summation: compute time and bytes per client, server time.
  Runs the pure protocol (nebula.federated.secagg) for every client of one combiner in this process, with a
  `--params`-parameter update and `--dropout` of the clients vanishing after the share check (the costly case: the
  server rebuilds their mask keys and strips their pairwise masks from each surviving neighbour's input). Every
  client signs with its own certificate and checks its neighbours', and checks every share it is dealt against
  the dealer's Feldman commitments (`secagg.vss`); the combiner checks the signed commitments and weights. Plain
  summation is the combiner adding the survivors' float32 updates. Clients run in parallel in a real round, so the
  protocol's share of a round is about one client's time plus the server's. Bytes are payload (keys, sealed
  shares, words, shares), not framing; the global model's download is the same for both and left out.
- switch: whole rounds through a real switch server: one cluster, its combiner and the controller, `--clients`
  lightweight clients (threads of processes of `--per-proc`, each its own switch connection; their training is a
  fixed `--train-s` wait) with a `--params`-parameter model, plain FedAvg against secure_aggregation: secagg+.
  `--dropout` of the clients (one process of their own) die in round 1 while training, after sharing their keys;
  rounds 2.. run without them. Round time: the median of rounds 2.. (no dropouts), and round 1's time past the
  deadline (what dropouts add once the deadline has passed: plain FedAvg reports, secagg+ unmasks). Bytes per
  client from the round records: the update's pieces, and secagg+'s stage messages (keys, shares, masked header,
  unmasking shares) up and down; the model's download is the same for both. CPU seconds per round of the
  combiner (with the controller), the switch and the clients' processes, which here share this machine's cores.
- accuracy: the recipe's task (recipes/federated: its data, model and client training) simulated in one process
  with `--dp-clients` non-IID clients, `--dp-per-round` a round on average (Poisson sampling), under client-level
  DP-FedAvg (clip to `--clip-norm`, central Gaussian noise) at each `--epsilons` (the noise multiplier that
  spends it in `--dp-rounds` rounds at delta 1e-5, from the RDP accountant) and without DP, against the central
  baseline.

    .venv/bin/python benchmarks/secagg.py --only pure --clients 100 --params 1000000 --dropout 0.1
    .venv/bin/python benchmarks/secagg.py --only switch --clients 100 --params 1000000 --dropout 0.1
    .venv/bin/python benchmarks/secagg.py --only accuracy --data langid.npz

The load average is printed with every table: the machine may be shared.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import math
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from nebula.federated.secagg import SecAggClient, SecAggConfig, SecAggServer  # noqa: E402


def credentials(names: list[str], d: Path):
    """A throwaway federation CA and a worker certificate per client (as `nebula-admin cert issue` writes them):
    (signers by client, a function giving a fresh verifier, as each client and the combiner hold their own)."""
    from nebula.federated.secagg import load_signer, load_verifier
    from security.ca import CertificateAuthority

    ca = CertificateAuthority.init(d / "ca", "bench")
    signers = {}
    for c in names:
        stem = c.replace("/", "-")
        ca.issue(f"client-{c.partition('/')[2]}", "worker", c.partition("/")[0], out_dir=d / "certs", stem=stem)
        signers[c] = load_signer(d / "certs" / f"{stem}.pem", d / "certs" / f"{stem}.key")
    crl = ca.write_crl()
    return signers, lambda: load_verifier(ca.cert_path, crl, "bench", lambda c: f"client-{c.partition('/')[2]}")


def measure(n: int, d: int, dropout: float, seed: int = 0) -> dict:
    """One round of `n` clients with `d` parameters; a fraction `dropout` drops after the share check. Every
    client signs with its own certificate and checks its neighbours' (keys, commitments, survivor set), checks the
    shares it is dealt against the dealers' Feldman commitments; the combiner checks signatures and weights."""
    import tempfile

    rng = np.random.default_rng(seed)
    names = [f"A/{i + 2}" for i in range(n)]
    params = SecAggConfig(clip_range=0.1, max_weight=1000, max_dropout=dropout).round_params(
        1, names, d, os.urandom(16))
    gone = set(rng.choice(names, round(dropout * n), replace=False))
    with tempfile.TemporaryDirectory(prefix="secagg-bench-") as tmp:
        signers, verifier = credentials(names, Path(tmp))
        srv = SecAggServer(params, verifier())
        cl = {c: SecAggClient(c, params, signers[c], verifier()) for c in names}
    ct = {c: 0.0 for c in names}  # each client's compute time
    stage = {c: {} for c in names}  # each client's time per stage
    up = {c: 0 for c in names}
    down = {c: 0 for c in names}
    st = 0.0

    def client(c, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        dt = time.perf_counter() - t0
        ct[c] += dt
        stage[c][fn.__name__] = dt
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
        m = client(c, cl[c].check_shares, dv)
        up[c] += sum(32 + len(x.dealer) for x in m.complaints)
        server(srv.receive_check, m)
    for c, v in server(srv.verdicts).items():
        if c in gone:
            continue
        x = rng.normal(0, 0.01, d).astype(np.float32)
        m = client(c, cl[c].mask, v, x, int(rng.integers(1, 1000)))
        up[c] += m.payload_bytes
        server(srv.receive_masked, m)
    for c, ss in server(srv.survivor_sets).items():
        down[c] += sum(len(x) for x in ss.survivors)
        m = client(c, cl[c].sign_survivors, ss)
        up[c] += len(m.signature)
        server(srv.receive_signature, m)
    for c, rq in server(srv.unmask_requests).items():
        down[c] += sum(len(s) for _, s in rq.signatures)
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
    return {"n": n, "degree": params.effective_degree, "threshold": params.threshold, "dropped": len(result.dropped),
            "client_mean": statistics.mean(times), "client_max": max(times), "server": st, "plain_server": plain,
            "check_mean": statistics.mean(stage[c]["check_shares"] for c in survivors),
            "mask_mean": statistics.mean(stage[c]["mask"] for c in survivors),
            "up": statistics.mean(up[c] for c in survivors), "down": statistics.mean(down[c] for c in survivors),
            "plain_up": 4 * d}


def load() -> str:
    """The load average now, as printed beside every table."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---- whole rounds through a switch server ------------------------------------------------------------------------
class _Light:
    """A client whose training is a fixed wait and whose change is small noise; `crash` dies while training."""

    def __init__(self, seed: int, train_s: float, size: int, crash: bool) -> None:
        self.rng = np.random.default_rng(seed)
        self.train_s, self.size, self.crash = train_s, size, crash

    def num_examples(self) -> int:
        return 100

    def get_parameters(self, config):
        return {"w": np.zeros(self.size, np.float32)}

    def fit(self, parameters, config):
        if self.crash:
            os._exit(3)
        time.sleep(self.train_s)
        return {"w": parameters["w"] + self.rng.normal(0, 0.01, self.size).astype(np.float32)}, 100, {}

    def evaluate(self, parameters, config):
        return 0.0, 1, {}


def light_client(cluster: str, index: int, num_clients: dict, train_s: float = 0.0, size: int = 1000,
                 crash: tuple = ()):
    """Factory of the lightweight client named in the benchmark's job file (`benchmarks.secagg:light_client`)."""
    from nebula.federated.client import Client

    cls = type("LightClient", (_Light, Client), {})
    return cls(seed=index, train_s=train_s, size=size, crash=index in crash)


def _cpu_rounds(fed, procs: list, rounds: int, timeout_s: float) -> tuple[float, float, float]:
    """CPU seconds per round, from the end of round 1 to the end of the last, of procs[0] (the combiner with the
    controller), procs[1] (the switch) and the rest together (the surviving clients' processes)."""
    from _fedbench import _cpu_s, _rounds

    marks: dict[int, list[float]] = {}
    end = time.monotonic() + timeout_s
    while procs[0].poll() is None and time.monotonic() < end and rounds not in marks:
        done = len(_rounds(fed)) if (fed.dir / "fl" / "trail" / "trail.db").exists() else 0
        if done in (1, rounds) and done not in marks:
            marks[done] = [_cpu_s(p.pid) or 0.0 for p in procs]
        time.sleep(0.2)
    if 1 not in marks or rounds not in marks:
        raise RuntimeError(f"the run ended before round {rounds} was recorded")
    per = [(b - a) / (rounds - 1) for a, b in zip(marks[1], marks[rounds])]
    return per[0], per[1], sum(per[2:])


def bench_switch(n: int, d: int, dropout: float, secure: bool, train_s: float, per_proc: int, rounds: int,
                 deadline_s: float) -> dict:
    """Rounds of `n` clients with a `d`-parameter model through one switch; `dropout` of them die in round 1."""
    from _fedbench import _Fed, _rounds

    fed = _Fed(["A"])
    try:
        crash = list(range(n - round(dropout * n), n))
        over = {"secure_aggregation": {"protocol": "secagg+", "clip_range": 0.1, "max_weight": 1000,
                                       "max_dropout": max(dropout, 0.01), "stage_timeout_s": 30,
                                       "signers": "signers/client-{index}"}} if secure else {}
        if secure:  # each client its own certificate, as `nebula-admin cert issue` writes them beside worker.yaml
            from security.ca import CertificateAuthority

            ca = CertificateAuthority.open(fed.dir / "prov" / "ca")
            for i in range(n):
                ca.issue(f"client-{i}", "worker", "A", out_dir=fed.dir / "prov" / "A" / "signers", stem=f"client-{i}")
        job = fed.job({"A": n}, rounds=rounds, deadline_s=deadline_s, piece_bytes=4 * 1024**2, max_update_norm=None,
                      client={"factory": "benchmarks.secagg:light_client",
                              "args": {"train_s": train_s, "size": d, "crash": crash}}, **over)
        ctl = fed.py("-m", "nebula.federated.run", "cluster", str(job), "--cluster", "A")
        survivors = [i for i in range(n) if i not in crash]
        code = ("import sys; from nebula.federated.run import run_clients; "
                "run_clients(sys.argv[1], sys.argv[2], [int(i) for i in sys.argv[3].split(',')])")
        procs = [fed.py("-c", code, str(job), "A", ",".join(map(str, survivors[at:at + per_proc])))
                 for at in range(0, len(survivors), per_proc)]
        if crash:
            fed.py("-c", code, str(job), "A", ",".join(map(str, crash)))
        # SECAGG_BENCH_STAGES=1: the combiner's stage closings echoed to stderr (each with its time since the
        # round's task went out), to see where a secure round's time goes
        stages = os.environ.get("SECAGG_BENCH_STAGES") == "1"
        threading.Thread(target=lambda: [print(f"  {line.rstrip()}", file=sys.stderr, flush=True) for line in
                                         ctl.stdout if stages and "stage closed" in line], daemon=True).start()
        cpu = _cpu_rounds(fed, [ctl, fed.switches[0], *procs], rounds, rounds * (deadline_s + 200) + 600)
        if ctl.wait(60):
            raise RuntimeError(f"controller exit {ctl.returncode}")
        rs = _rounds(fed)
        first, rest = rs[0], rs[1:]
        ups = [r.detail["update_bytes"] / r.num_updates for r in rest]
        sec = [r.detail.get("secure", {}).get("protocol_bytes", [0, 0]) for r in rest]
        return {"clients": n, "protocol": "secagg+" if secure else "plain", "round_s": statistics.median(
            r.duration_s for r in rest), "updates": [r.num_updates for r in rs], "status": [r.status for r in rs],
            "after_deadline_s": first.duration_s - deadline_s, "dropped": len(first.detail.get("secure", {}).get(
                "dropped", first.detail.get("missing", []))),
            "update_bytes": statistics.mean(ups), "stage_up": statistics.mean(b[0] / r.num_updates for b, r in
                                                                              zip(sec, rest)),
            "stage_down": statistics.mean(b[1] / r.num_updates for b, r in zip(sec, rest)), "load": load(),
            "combiner_cpu_s": cpu[0], "switch_cpu_s": cpu[1], "clients_cpu_s": cpu[2],
            "survivors": len(survivors)}
    finally:
        fed.close()


# ---- differential privacy's accuracy on the recipe's task --------------------------------------------------------
def bench_dp_accuracy(data_path: str, epsilons: list[float], num_clients: int, per_round: int, rounds: int,
                      clip_norm: float, alpha: float, lr: float, local_epochs: int, seed: int = 0) -> list[dict]:
    """Held-out accuracy after `rounds` rounds of DP-FedAvg at each epsilon (None: no DP), central noise."""
    import paddle
    import paddle.nn.functional as F

    from nebula.federated.privacy import (DPConfig, PrivacyAccountant, add_gaussian_noise, clip_update,
                                          noise_for_epsilon, server_noise_std)
    from recipes.federated.central import test_accuracy
    from recipes.federated.data import densify, dirichlet_split, load_prepared
    from recipes.federated.model import LangIdModel

    d = load_prepared(data_path)
    y = d["train_labels"]
    x = densify(d["train_indices"], d["train_indptr"], np.arange(len(y)))
    parts = [p for p in dirichlet_split(y, num_clients, alpha, seed) if len(p)]
    q = per_round / len(parts)
    rows = []
    for eps in epsilons:
        paddle.seed(seed)
        model = LangIdModel(num_langs=len(d["langs"]), seed=seed)
        weights = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        z = noise_for_epsilon(eps, rounds, q, 1e-5) if eps else 0.0
        cfg = DPConfig(clip_norm=clip_norm, noise_multiplier=z) if eps else None
        rng = np.random.default_rng(seed + 1)
        norms, accs = [], []
        for _ in range(rounds):
            # Poisson sampling, as the controller draws under DP and the accountant assumes: each client with
            # probability q; the mean's denominator is the expected count, per_round (not the count drawn)
            chosen = np.flatnonzero(rng.random(len(parts)) < q)
            total = {k: np.zeros(v.shape, np.float64) for k, v in weights.items()}
            for i in chosen:
                model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
                opt = paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters())
                idx = parts[i]
                for _ in range(local_epochs):
                    for b in range(0, len(idx), 32):
                        sel = idx[b:b + 32]
                        loss = F.cross_entropy(model(paddle.to_tensor(x[sel])),
                                               paddle.to_tensor(y[sel].reshape(-1, 1)))
                        loss.backward()
                        opt.step()
                        opt.clear_grad()
                change = {k: v.numpy().astype(np.float64) - weights[k] for k, v in model.state_dict().items()}
                if cfg is not None:
                    change, norm = clip_update(change, clip_norm)
                    norms.append(norm)
                for k in total:
                    total[k] += change[k]
            if cfg is not None:  # central DP: N(0, (zC)^2) on the sum of the clipped changes
                total = add_gaussian_noise(total, server_noise_std(cfg), rng)
            weights = {k: (weights[k] + total[k] / per_round).astype(np.float32) for k in weights}
            model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
            accs.append(test_accuracy(model, d))
        spent = PrivacyAccountant(z, q, 1e-5, "rdp", rounds).epsilon() if eps else None
        rows.append({"epsilon": eps, "noise_multiplier": z, "epsilon_spent": spent, "accuracy": accs,
                     "median_norm": statistics.median(norms) if norms else None, "load": load()})
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def smallest(a: argparse.Namespace) -> argparse.Namespace:
    """`a` capped under NEBULA_SMOKE (nebula/smoke.py: how CI runs the printed tables) at about the README's small
    command's sizes, every table and row still printed: a tenth of each client count (at least 10), 10,000
    parameters, training 0.2 s, a 15 s deadline (round 1 waits it out for its dropped clients), DP over 50 clients,
    10 a round, 4 rounds at every epsilon given."""
    from nebula import smoke

    return argparse.Namespace(**{**vars(a), "clients": [min(n, max(10, n // 10)) for n in a.clients]
                                 if smoke.active() else a.clients, "params": smoke.cap(a.params, 10_000),
                                 "train_s": smoke.cap(a.train_s, 0.2), "deadline_s": smoke.cap(a.deadline_s, 15.0),
                                 "dp_clients": smoke.cap(a.dp_clients, 50),
                                 "dp_per_round": smoke.cap(a.dp_per_round, 10), "dp_rounds": smoke.cap(a.dp_rounds, 4)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="pure,switch", help="pure,switch,accuracy")
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 500])
    ap.add_argument("--params", type=int, default=1_000_000)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--train-s", type=float, default=5.0, help="switch: the clients' training time per round")
    ap.add_argument("--per-proc", type=int, default=50, help="switch: lightweight clients per process")
    ap.add_argument("--rounds", type=int, default=3, help="switch: rounds per run (round 1 has the dropouts)")
    ap.add_argument("--deadline-s", type=float, default=120.0, help="switch: the round deadline")
    ap.add_argument("--data", help="accuracy: prepared recipe data (.npz); made in a temporary directory if left out")
    ap.add_argument("--epsilons", default="0,8,4,1", help="accuracy: target epsilons (0: no DP)")
    ap.add_argument("--dp-clients", type=int, default=1000)
    ap.add_argument("--dp-per-round", type=int, default=200)
    ap.add_argument("--dp-rounds", type=int, default=20)
    ap.add_argument("--clip-norm", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.5, help="accuracy: the clients' SGD learning rate")
    ap.add_argument("--local-epochs", type=int, default=2)
    ap.add_argument("--alpha", type=float, default=0.1)
    a = smallest(ap.parse_args())
    only = set(a.only.split(","))
    if "pure" in only:
        print(f"\n## SecAgg+ protocol compute vs plain summation: {a.params:,} parameters, {a.dropout:.0%} of clients "
              f"drop after the share check (load average {load()})")
        print("| clients | k | t | client s | max s | share check s | mask s | server s | plain s | compute x | up MB | "
              "down KB | up x |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for n in a.clients:
            r = measure(n, a.params, a.dropout)
            ratio = (r["client_max"] + r["server"]) / r["plain_server"]
            print(f"| {r['n']} | {r['degree']} | {r['threshold']} | {r['client_mean']:.3f} | {r['client_max']:.3f} | "
                  f"{r['check_mean']:.3f} | {r['mask_mean']:.3f} | {r['server']:.2f} | {r['plain_server']:.3f} | "
                  f"{ratio:.1f} | {r['up'] / 1e6:.3f} | {r['down'] / 1e3:.1f} | {r['up'] / r['plain_up']:.3f} |")
        print("client s: one survivor's protocol compute (mean, max), of which share check s (opening and checking its "
              "neighbours' shares against their commitments)\nand mask s (the masks) are means; server s: the "
              "combiner's; plain s: adding the survivors' float32 updates;\ncompute x: (client max + server) / plain, "
              "protocol compute only (no training, no network); up x: bytes a client sends / a float32 update's; "
              f"load average after: {load()}")
    if "switch" in only:
        rows = []
        for n in a.clients:
            for secure in (False, True):
                print(f"  {n} clients, {'secagg+' if secure else 'plain'}: load average {load()}", file=sys.stderr,
                      flush=True)
                rows.append(bench_switch(n, a.params, a.dropout, secure, a.train_s, a.per_proc, a.rounds,
                                         a.deadline_s))
                print(f"  {rows[-1]}", file=sys.stderr, flush=True)
        cores = os.cpu_count() or 1
        print(f"\n## Rounds through a switch server: one combiner, {a.params:,}-parameter model, training "
              f"{a.train_s:g} s, {a.dropout:.0%} of the clients die in round 1 (deadline {a.deadline_s:g} s; "
              f"{cores} cores)")
        print("| clients | aggregation | round s (median, rounds 2..) | vs plain | round s, client CPU off the critical "
              "path | vs plain, client CPU off the critical path | round 1 s past the deadline | dropped | update bytes "
              "per client | stage bytes up per client | stage bytes down per client | CPU s per round: combiner, "
              "switch, clients | load average after |\n"
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
        for r in rows:  # the clients' CPU, spread over this machine's cores, replaced by one client's (its own host)
            r["off_s"] = r["round_s"] - r["clients_cpu_s"] / cores + r["clients_cpu_s"] / r["survivors"]
        for r in rows:
            base = next(b for b in rows if b["clients"] == r["clients"] and b["protocol"] == "plain")
            print(f"| {r['clients']} | {r['protocol']} | {r['round_s']:.2f} | {r['round_s'] / base['round_s']:.2f}x | "
                  f"{r['off_s']:.2f} | {r['off_s'] / base['off_s']:.2f}x | "
                  f"{r['after_deadline_s']:.2f} | {r['dropped']} | {r['update_bytes']:.0f} | {r['stage_up']:.0f} | "
                  f"{r['stage_down']:.0f} | {r['combiner_cpu_s']:.1f}, {r['switch_cpu_s']:.1f}, "
                  f"{r['clients_cpu_s']:.1f} | {r['load']} |")
        print("update bytes: the pieces of an update (plain: float32 weights; secagg+: the masked 32-bit words, one per "
              "parameter);\nstage bytes: secagg+'s key, share (with the Feldman commitments), share-check, "
              "masked-header, survivor-set and unmask messages as sent (JSON headers, bytes as base64, but the "
              "Feldman commitments, raw after the sa_shares and sa_delivery headers); CPU s: from /proc, per round "
              "from the end of "
              "round 1 to the last (the combiner's process with the controller, the switch, the surviving clients' "
              "processes together);\nclient CPU off the critical path: round s - clients' CPU s / cores + clients' "
              "CPU s / clients (each client's compute on its own host, at the same time as the others')")
    if "accuracy" in only:
        data = a.data
        if data is None:
            import tempfile

            from recipes.federated.data import prepare

            data = str(Path(tempfile.mkdtemp(prefix="secagg-data-")) / "langid.npz")
            prepare(data)
        from recipes.federated.central import train_central

        eps = [float(e) for e in a.epsilons.split(",")]
        rows = bench_dp_accuracy(data, eps, a.dp_clients, a.dp_per_round, a.dp_rounds, a.clip_norm, a.alpha, a.lr,
                                 a.local_epochs)
        epochs = max(1, math.ceil(a.dp_rounds * a.dp_per_round / a.dp_clients))
        central = train_central(data, epochs)
        print(f"\n## DP-FedAvg on the recipe's task: {a.dp_clients} non-IID clients (alpha={a.alpha}), "
              f"{a.dp_per_round} a round on average (Poisson sampling), {a.dp_rounds} rounds, clip_norm {a.clip_norm}, "
              "central noise, delta 1e-5 "
              f"(load average {load()})")
        print("| target epsilon | noise multiplier | epsilon spent (RDP) | median client change norm | "
              + " | ".join(f"accuracy after round {i}" for i in (1, a.dp_rounds // 2, a.dp_rounds)) + " |\n"
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            acc = r["accuracy"]
            spent = "-" if r["epsilon_spent"] is None else f"{r['epsilon_spent']:.3f}"
            norm = "-" if r["median_norm"] is None else f"{r['median_norm']:.3f}"
            print(f"| {r['epsilon'] or 'no DP'} | {r['noise_multiplier']:.3f} | {spent} | {norm} | {acc[0]:.4f} | "
                  f"{acc[a.dp_rounds // 2 - 1]:.4f} | {acc[-1]:.4f} |")
        print(f"| central baseline ({epochs} epochs of all data) | | | | | | {central[-1]:.4f} |")


if __name__ == "__main__":
    main()
