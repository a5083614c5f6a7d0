"""Benchmark the federated mode: scale, combiner memory, WAN bytes, accuracy against a central baseline, attacks.

    .venv/bin/python benchmarks/federated.py [--only scale,memory,wan,accuracy,codec,robust]

- scale: round time of one combiner with 200 and with 1000 lightweight clients (real switch, real channels; the
  clients live as threads of a few processes, each with its own switch connection, and "train" for a fixed
  --train-s, as FEDn's cross-device clients spend most of a round training). Target: ratio <= 1.5.
- memory: peak resident memory of a combiner process (VmHWM minus its resident size before the round) while it
  aggregates --mem-clients updates of a --mem-mb model. Target: <= 2x the model's size.
- wan: bytes the controller sends over the WAN per round to a cluster of clients, with and without WAN-once.
- accuracy: the recipe's task (recipes/federated) simulated in-process with the same strategies and clients,
  held-out accuracy after each round against central training on all data after the same examples seen.
- codec: the same task with each --codecs update codec (clients send their change encoded, error feedback kept
  per client): update bytes per round (client -> combiner; WAN bytes where clients are remote from their combiner)
  and accuracy after each round.
- flower: round time on the encrypted path (clients over mutual TLS to their switch, or CURVE with --flower-remote
  tcp; the combiner on its switch's host and, a second time, on another host like the clients; the controller
  behind mutual TLS between two switches; every process as deployed, no MALLOC_* settings)
  against Flower's FedAvg (legacy gRPC, server-authenticated TLS) for
  --flower-sizes, the same four-tensor model and fixed updates; the Flower column where an interpreter has `flwr`
  (an optional extra, not a dependency: `python -m venv /work/venv-flwr && /work/venv-flwr/bin/pip install flwr`,
  or --flwr-python).
- robust: the same task with 0, 10% and 20% byzantine clients (their update's change scaled by 10 or by -1,
  sign-flipped; the attackers are the clients holding the most examples) under fedavg, trimmed_mean, median,
  krum and multi_krum.

numpy's BLAS runs single-threaded (OPENBLAS_NUM_THREADS=1 unless set), as in benchmarks/compression.py.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from _fedbench import _client_procs, _cpu_s, _Fed, _mem, _rounds  # benchmarks/ is this script's directory
from _fedflower import bench_flower, flower_python


def bench_scale(counts: list[int], train_s: float, per_proc: int, rounds: int, size: int = 1000) -> list[dict]:
    """Median round time (rounds 2..) of one combiner with each number of clients, and the CPU seconds per round
    the combiner's process (with the controller), the switch and the client processes used from the end of round
    1 to the last round: what each client costs them, whatever else the machine runs."""
    rows = []
    for n in counts:
        fed = _Fed(["A"])
        try:
            job = fed.job({"A": n}, rounds=rounds, client={"factory": "benchmarks._fedbench:light_client",
                                                            "args": {"train_s": train_s, "size": size}})
            switch = fed.switches[0]
            ctl = fed.py("-m", "nebula.federated.run", "cluster", str(job), "--cluster", "A")
            threading.Thread(target=lambda: [None for _ in ctl.stdout], daemon=True).start()
            clients = _client_procs(fed, job, "A", n, per_proc)
            cpu: dict[int, tuple] = {}  # rounds done -> (combiner CPU s, switch CPU s, all clients' CPU s)
            end = time.monotonic() + 1800
            while ctl.poll() is None and time.monotonic() < end:
                done = len(_rounds(fed)) if (fed.dir / "fl" / "trail" / "trail.db").exists() else 0
                if done and done not in cpu:
                    each = [_cpu_s(p.pid) for p in clients]
                    cpu[done] = (_cpu_s(ctl.pid), _cpu_s(switch.pid), None if None in each else sum(each))
                time.sleep(0.2)
            switch_peak = _mem(switch.pid)["VmHWM"]
            ctl.wait(60)
            if ctl.returncode:
                raise RuntimeError(f"controller exit {ctl.returncode}")
            times = [r.duration_s for r in _rounds(fed)[1:]]
            last = max(k for k, v in cpu.items() if None not in v)
            first = min(cpu)  # round 1's end, or the first end the polling saw (short rounds can pass unseen)
            per = [(cpu[last][i] - cpu[first][i]) / max(1, last - first) for i in (0, 1, 2)]
            rows.append({"clients": n, "round_s": statistics.median(times), "rounds": len(times),
                         "updates": _rounds(fed)[-1].num_updates, "combiner_cpu_s": per[0], "switch_cpu_s": per[1],
                         "clients_cpu_s": per[2], "switch_peak_mb": switch_peak / 1e6})
            print(f"  {rows[-1]} (round times {[round(t, 2) for t in times]})", file=sys.stderr, flush=True)
        finally:
            fed.close()
    return rows


def bench_memory(model_mb: int, num_clients: int) -> dict:
    """Peak combiner memory while aggregating `num_clients` updates of a `model_mb` MB model."""
    fed = _Fed(["A"])
    try:
        size = model_mb * 1024 * 1024 // 4
        job = fed.job({"A": num_clients}, rounds=1, client={"factory": "benchmarks._fedbench:light_client",
                                                             "args": {"size": size}})
        comb = fed.py("-m", "nebula.federated.run", "combiner", str(job), "--cluster", "A")
        fed.wait_line(comb, "ready", 120)
        threading.Thread(target=lambda: [None for _ in comb.stdout], daemon=True).start()
        time.sleep(1.0)
        base = _mem(comb.pid)
        clients = _client_procs(fed, job, "A", num_clients, num_clients)
        peak_anon = base["RssAnon"]
        peak = base["VmRSS"]
        ctl = fed.py("-m", "nebula.federated.run", "controller", str(job), "--cluster", "A")
        while ctl.poll() is None:
            try:
                m = _mem(comb.pid)
            except FileNotFoundError:
                break
            peak, peak_anon = max(peak, m.get("VmHWM", 0)), max(peak_anon, m.get("RssAnon", 0))
            time.sleep(0.02)
        out = ctl.stdout.read()
        if ctl.returncode:
            raise RuntimeError(out[-3000:])
        r = _rounds(fed)[-1]
        model_bytes = size * 4
        return {"model_mb": model_bytes / 2**20, "clients": num_clients, "updates": r.num_updates,
                "combiner_base_mb": base["VmRSS"] / 2**20, "combiner_peak_mb": peak / 2**20,
                "growth_x_model": (peak - base["VmRSS"]) / model_bytes,
                "private_growth_x_model": (peak_anon - base["RssAnon"]) / model_bytes, "_": clients}
    finally:
        fed.close()


def bench_wan(num_clients: int, model_kb: int) -> list[dict]:
    """Controller-to-remote-cluster bytes per round with and without WAN-once (clients all in cluster B)."""
    rows = []
    for once in (True, False):
        fed = _Fed(["A", "B"])
        try:
            job = fed.job({"A": 0, "B": num_clients}, rounds=2, wan_once=once,
                          client={"factory": "benchmarks._fedbench:light_client", "args": {"size": model_kb * 256}})
            ctl = fed.py("-m", "nebula.federated.run", "cluster", str(job), "--cluster", "A")
            fed.py("-m", "nebula.federated.run", "cluster", str(job), "--cluster", "B")
            _client_procs(fed, job, "B", num_clients, num_clients)
            out, _ = ctl.communicate(timeout=600)
            if ctl.returncode:
                raise RuntimeError(out[-3000:])
            rs = _rounds(fed)
            rows.append({"wan_once": once, "clients_in_B": num_clients, "model_kb": model_kb,
                         "wan_bytes_per_round": statistics.mean(r.detail["wan_bytes"] for r in rs)})
        finally:
            fed.close()
    return rows


# ---- the recipe's task, simulated in one process with the same strategies
def _simulate(data: dict, clients: list, strategy: str, options: dict, rounds: int, byzantine: int = 0,
              attack: str = "none", seed: int = 0, codec: str = "none", sent: list | None = None) -> list[float]:
    """Held-out accuracy after each round. With `codec`, every client sends its change encoded as the client
    loop does (nebula.federated.intake.UpdateEncoder, error feedback kept per client), the change decoded from
    the frames is averaged and added to the global model, and `sent` gets each round's update bytes."""
    import paddle

    from nebula.compress import decode_from_frames
    from nebula.federated import RunningMean, get_strategy
    from nebula.federated.intake import UpdateEncoder
    from nebula.messaging import PIECE_BYTES, piece_plan, tensor_specs
    from recipes.federated.central import test_accuracy
    from recipes.federated.model import LangIdModel

    strat = get_strategy(strategy, options)
    model = LangIdModel(num_langs=len(data["langs"]), seed=seed)
    weights = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    state: dict = {}
    accs = []
    encoders = [UpdateEncoder(codec, PIECE_BYTES) for _ in clients] if codec != "none" else None
    # the attackers are the clients with the most examples: the most weight under example-weighted averaging
    attackers = set(sorted(range(len(clients)), key=lambda i: -clients[i].num_examples())[:byzantine])
    for _ in range(rounds):
        ups = []
        nbytes = 0
        for i, c in enumerate(clients):
            w, n, _ = c.fit(weights, {})
            if i in attackers:
                delta = {k: w[k] - weights[k] for k in w}
                scale = -1.0 if attack == "flip" else 10.0
                w = {k: weights[k] + scale * delta[k] for k in w}
            if encoders is None:
                nbytes += sum(v.nbytes for v in w.values())
            else:  # what the combiner gets: the decoded change, added back to the model it was trained from
                got = {k: np.array(v, copy=True) for k, v in weights.items()}
                for (name, off, count), frames in zip(piece_plan(tensor_specs(w), PIECE_BYTES), encoders[i].frames(w, weights)):
                    nbytes += sum(len(memoryview(f).cast("B")) for f in frames)
                    got[name].reshape(-1)[off : off + count] += decode_from_frames(frames)
                w = got
            ups.append((w, n))
        if sent is not None:
            sent.append(nbytes)
        if strat.streaming:
            rm = RunningMean()
            for w, n in ups:
                rm.add(w, n)
            mean = rm.result()
        else:
            mean = strat.combine(ups)
        weights, state = strat.server_step(weights, mean, state)
        model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
        accs.append(test_accuracy(model, data))
    return accs


def _recipe_clients(data_path: str, num: int, alpha: float, seed: int = 0) -> list:
    from recipes.federated.client import make_client

    return [make_client("A", i, {"A": num}, data_path, alpha=alpha, seed=seed) for i in range(num)]


def bench_accuracy(data_path: str, rounds: int, num_clients: int, alpha: float) -> dict:
    from recipes.federated.central import train_central
    from recipes.federated.data import load_prepared

    data = load_prepared(data_path)
    fed = _simulate(data, _recipe_clients(data_path, num_clients, alpha), "fedavg", {}, rounds)
    central = train_central(data_path, rounds)
    return {"rounds": rounds, "clients": num_clients, "alpha": alpha, "federated": fed, "central": central}


def bench_codecs(data_path: str, rounds: int, num_clients: int, alpha: float, codecs: list[str]) -> list[dict]:
    """Accuracy after each round and update bytes per round with each update codec (fedavg)."""
    from recipes.federated.data import load_prepared

    data = load_prepared(data_path)
    rows = []
    for codec in codecs:
        sent: list[int] = []
        acc = _simulate(data, _recipe_clients(data_path, num_clients, alpha), "fedavg", {}, rounds, codec=codec,
                        sent=sent)
        rows.append({"codec": codec, "accuracy": acc, "bytes_per_round": statistics.mean(sent)})
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def bench_robust(data_path: str, rounds: int, num_clients: int, alpha: float) -> list[dict]:
    from recipes.federated.data import load_prepared

    data = load_prepared(data_path)
    rows = []
    strategies = [("fedavg", {}), ("trimmed_mean", {"trim_ratio": 0.2}), ("median", {}),
                  ("krum", {"num_byzantine": 2}), ("multi_krum", {"num_byzantine": 2})]
    for attack in ("scale", "flip"):
        for frac in (0.0, 0.1, 0.2):
            if frac == 0.0 and attack == "flip":
                continue
            byz = int(round(frac * num_clients))
            for name, opts in strategies:
                clients = _recipe_clients(data_path, num_clients, alpha)
                acc = _simulate(data, clients, name, opts, rounds, byz, attack)
                rows.append({"attack": attack if byz else "none", "byzantine": f"{frac:.0%}", "strategy": name,
                             "accuracy": acc[-1]})
                print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def _smallest_sizes(sizes: str) -> str:
    """--flower-sizes at the smallest size under NEBULA_SMOKE: a row for each size printed, its model a hundredth
    (at least 1000 floats) and a tenth of its clients (2 to 10), so distinct sizes stay distinct rows."""
    from nebula import smoke

    if not smoke.active():
        return sizes
    pairs = [tuple(int(x) for x in s.split("x")) for s in sizes.split(",")]
    return ",".join(f"{max(1000, f // 100)}x{min(n, max(2, min(10, n // 10)))}" for f, n in pairs)


def smallest(args: argparse.Namespace) -> argparse.Namespace:
    """`args` capped at the smallest size that still runs every table (NEBULA_SMOKE, nebula/smoke.py: how CI runs
    the printed commands): two rounds of seven clients (Krum with 2 Byzantine needs 7), the scale run at 10 and
    20 clients for three rounds, small models."""
    from nebula import smoke

    counts = ",".join(str(smoke.cap(int(c), 10 * (i + 1))) for i, c in enumerate(args.counts.split(",")))
    return argparse.Namespace(**{**vars(args), "counts": counts, "flower_sizes": _smallest_sizes(args.flower_sizes),
                                 "train_s": smoke.cap(args.train_s, 1.0),
                                 "scale_rounds": smoke.cap(args.scale_rounds, 3),  # (rounds 2+ measured)
                                 "rounds": smoke.cap(args.rounds, 2), "clients": smoke.cap(args.clients, 7),
                                 "mem_mb": smoke.cap(args.mem_mb, 16), "mem_clients": smoke.cap(args.mem_clients, 2),
                                 "wan_clients": smoke.cap(args.wan_clients, 3), "wan_kb": smoke.cap(args.wan_kb, 64),
                                 "flower_rounds": smoke.cap(args.flower_rounds, 3)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="scale,memory,wan,accuracy,robust")
    p.add_argument("--counts", default="200,1000")
    p.add_argument("--train-s", type=float, default=5.0, help="lightweight clients' training time per round")
    p.add_argument("--per-proc", type=int, default=100, help="lightweight clients per process")
    p.add_argument("--scale-rounds", type=int, default=4)
    p.add_argument("--scale-size", type=int, default=1000, help="float32 values in each scale client's model")
    p.add_argument("--flower-sizes", default="1000000x10,1000000x50",
                   help="FLOATSxCLIENTS runs of --only flower (Nebula's encrypted path against Flower)")
    p.add_argument("--flower-rounds", type=int, default=5)
    p.add_argument("--flower-remote", choices=("tls", "tcp"), default="tls",
                   help="how --only flower's workers on other hosts reach their switch: tls (the switch's TLS "
                        "endpoint for workers) or tcp (ZeroMQ's CURVE)")
    p.add_argument("--flwr-python", default=None, help="an interpreter with flwr (default: /work/venv-flwr's)")
    p.add_argument("--mem-mb", type=int, default=256)
    p.add_argument("--mem-clients", type=int, default=4)
    p.add_argument("--wan-clients", type=int, default=6)
    p.add_argument("--wan-kb", type=int, default=1024)
    p.add_argument("--data", help="prepared recipe data (.npz); made in a temporary directory when left out")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--codecs", default="none;fp16;ef(int8_block);topk(0.05);ef(topk(0.05))",
                   help="update codecs to compare (';'-separated; the first is the baseline of the ratio)")
    args = smallest(p.parse_args())
    only = set(args.only.split(","))
    if "scale" in only:
        load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
        rows = bench_scale([int(c) for c in args.counts.split(",")], args.train_s, args.per_proc, args.scale_rounds,
                           args.scale_size)
        print(f"\n## Round time, one combiner, lightweight clients (training {args.train_s:.1f} s each, models of "
              f"{args.scale_size} float32; load average {load0} before, "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after)")
        print("| clients | median round s | updates per round | combiner+controller CPU s per round | "
              "switch CPU s per round | client processes' CPU s per round | switch peak RSS MB |\n"
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['clients']} | {r['round_s']:.2f} | {r['updates']} | {r['combiner_cpu_s']:.2f} | "
                  f"{r['switch_cpu_s']:.2f} | {r['clients_cpu_s']:.2f} | {r['switch_peak_mb']:.0f} |")
        if len(rows) >= 2:
            print(f"\nratio {rows[-1]['clients']} / {rows[0]['clients']} clients: "
                  f"{rows[-1]['round_s'] / rows[0]['round_s']:.2f}x (target <= 1.5x; FEDn reports 2x)")
    if "flower" in only:
        py = flower_python(args.flwr_python)
        load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
        sizes = [tuple(int(x) for x in s.split("x")) for s in args.flower_sizes.split(",")]
        rows = bench_flower(sizes, args.flower_rounds, args.per_proc, py, args.flower_remote)
        print(f"\n## Round time on the encrypted path against Flower (median of whole round cycles from round 2 of "
              f"{args.flower_rounds}: Nebula's from one round's start to the next's, Flower's from one aggregation to "
              f"the next; "
              f"workers on other hosts over {'mutual TLS' if args.flower_remote == 'tls' else 'CURVE'}; "
              f"load average {load0} before, {' '.join(f'{x:.2f}' for x in os.getloadavg())} after)")
        if py is None:
            print("Flower: left out: flwr is not installed (pip install flwr into /work/venv-flwr, or name an "
                  "interpreter that has it with --flwr-python); Nebula's side measured alone")
        print("| model floats | clients | Nebula s, combiner on the switch's host | combiner on another host | "
              "Flower s | Nebula / Flower | Nebula switch peak RSS MB |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            fl = (f"{r['flower_s']:.2f} | {r['switch_host'] / r['flower_s']:.2f}, {r['remote'] / r['flower_s']:.2f}"
                  if r["flower_s"] else "- | -")
            print(f"| {r['floats']} | {r['clients']} | {r['switch_host']:.2f} | {r['remote']:.2f} | {fl} | "
                  f"{r['switch_peak_mb']:.0f} |")
    if "memory" in only:
        r = bench_memory(args.mem_mb, args.mem_clients)
        print("\n## Combiner memory while aggregating")
        print("| model MB | updates | RSS before MB | peak RSS MB | RSS growth / model | private growth / model |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        print(f"| {r['model_mb']:.0f} | {r['updates']} | {r['combiner_base_mb']:.0f} | {r['combiner_peak_mb']:.0f} | "
              f"{r['growth_x_model']:.2f}x | {r['private_growth_x_model']:.2f}x |")
        print("target: growth <= 2x the model's size (RSS also counts the switch's shared-memory arena pages the "
              "combiner touched, local.shm_bytes; private memory does not)")
    if "wan" in only:
        rows = bench_wan(args.wan_clients, args.wan_kb)
        print("\n## WAN bytes per round (controller in A, every client in B)")
        print("| WAN-once | clients in B | model KB | bytes A->B per round |\n| --- | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {'yes' if r['wan_once'] else 'no'} | {r['clients_in_B']} | {r['model_kb']} | "
                  f"{r['wan_bytes_per_round']:.0f} |")
        print(f"\nratio without / with WAN-once: {rows[1]['wan_bytes_per_round'] / rows[0]['wan_bytes_per_round']:.2f}x")
    if only & {"accuracy", "robust", "codec"}:
        data = args.data
        if data is None:
            from recipes.federated.data import prepare

            data = str(Path(tempfile.mkdtemp(prefix="flbench-data-")) / "langid.npz")
            prepare(data)
        if "accuracy" in only:
            r = bench_accuracy(data, args.rounds, args.clients, args.alpha)
            print(f"\n## Accuracy: {r['clients']} non-IID clients (Dirichlet alpha={r['alpha']}), fedavg, vs central")
            print("| round = epochs seen | federated | central |\n| ---: | ---: | ---: |")
            for i, (f, c) in enumerate(zip(r["federated"], r["central"]), 1):
                print(f"| {i} | {f:.4f} | {c:.4f} |")
        if "codec" in only:
            rows = bench_codecs(data, args.rounds, args.clients, args.alpha, args.codecs.split(";"))
            print(f"\n## Compressed updates: {args.clients} non-IID clients (alpha={args.alpha}), fedavg, update "
                  "bytes per round (client -> combiner) and held-out accuracy after each round")
            print("| update_codec | bytes per round | vs none | " + " | ".join(f"round {i}" for i in
                                                                         range(1, args.rounds + 1)) + " |")
            print("| --- | ---: | ---: |" + " ---: |" * args.rounds)
            raw = rows[0]["bytes_per_round"]
            for r in rows:
                print(f"| {r['codec']} | {r['bytes_per_round']:.0f} | {raw / r['bytes_per_round']:.2f}x | "
                      + " | ".join(f"{a:.4f}" for a in r["accuracy"]) + " |")
        if "robust" in only:
            rows = bench_robust(data, args.rounds, args.clients, args.alpha)
            print(f"\n## Held-out accuracy after {args.rounds} rounds under attack ({args.clients} clients)")
            names = ["fedavg", "trimmed_mean", "median", "krum", "multi_krum"]
            print("| attack | byzantine | " + " | ".join(names) + " |\n| --- | ---: |" + " ---: |" * len(names))
            for key in dict.fromkeys((r["attack"], r["byzantine"]) for r in rows):
                accs = {r["strategy"]: r["accuracy"] for r in rows if (r["attack"], r["byzantine"]) == key}
                print(f"| {key[0]} | {key[1]} | " + " | ".join(f"{accs[n]:.3f}" for n in names) + " |")
    _ = json


if __name__ == "__main__":
    main()
