"""Benchmark nebula.balance in Sky Computing's setting: predicted iteration time of each allocator vs the optimum.

Models: BERT-style classifiers of 40, 80 and 160 encoder layers plus embedding, pooler and head (hidden 1024,
16 heads, batch 32 x 128 tokens, fp32 with Adam; analytic costs from nebula.balance.bert). Devices: 16, 32 and 64
copies of one base device (5 TFLOP/s effective, a P100-class GPU) slowed by factors drawn as in the paper
(normal, mean 4, std 2, clipped to [1, 7], nebula.balance.simulate), each linked to the next at 10 Gbit/s with
100 us latency. Memory: every device gets 1x-3x (uniform) the largest stage of the even allocation, so even fits
and the fast devices cannot take arbitrarily many layers ('tight'), or 16 GB each as the paper's P100 nodes
('p100'). For each instance and allocator the table shows the
predicted iteration time (the bottleneck stage) as a ratio to `optimal`, and the allocator's own run time.
`optimal-order` may beat 1.00 (it also reorders the devices); `milp` runs where HiGHS finishes within its limit.

    .venv/bin/python benchmarks/allocation.py [--seeds 3] [--milp-limit 20] [--profile] [--real-run FILE]

`--profile` adds real Paddle layer profiles (nebula.balance.profile) on the current device (GPU if present).
`--real-run FILE` adds the predicted-vs-measured section of a real run: FILE holds JSON lines
``{"label": ..., "predicted_s": ..., "measured_s": ...}`` (see `real_run_table`).
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # single-threaded BLAS: timings of this process, not neighbours'
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import math
import statistics
import sys
import time
from typing import Sequence

import numpy as np

from nebula.balance import AllocationError, DeviceProfile, LayerCost, allocate, reallocate
from nebula.balance.bert import bert_costs, preset
from nebula.balance.even import even_bounds
from nebula.balance.simulate import Slowdown, draw_factors

MODELS = ("bert-40", "bert-80", "bert-160")
NUM_DEVICES = (16, 32, 64)
METHODS = ("even", "sky", "optimal", "optimal-order", "milp")
BASE = DeviceProfile(time_per_flop_s=1 / 5e12, memory_bytes=math.inf, latency_s=1e-4, bandwidth_bytes_per_s=1.25e9)


def paper_devices(layers: Sequence[LayerCost], num_devices: int, seed: int, memory: str) -> list[DeviceProfile]:
    """Devices of one instance: slowdowns normal(4, 2) clipped to [1, 7]; memory per `memory` (MEMORY_DOC)."""
    factors = draw_factors(num_devices, seed)
    bounds = even_bounds(len(layers), num_devices)
    need = max(sum(x.memory_bytes for x in layers[a:b]) for a, b in zip(bounds, bounds[1:]))
    rng = np.random.default_rng((seed, 1))
    out = []
    for k, f in enumerate(factors):
        dev = Slowdown(compute=f).device(BASE)
        cap = 16e9 if memory == "p100" else float(need * rng.uniform(1.0, 3.0))
        out.append(DeviceProfile(dev.time_per_flop_s, cap, dev.latency_s, dev.bandwidth_bytes_per_s, name=f"d{k}"))
    return out


def run_method(method: str, layers, devices, milp_limit: float):
    """(allocation or None, seconds, note)."""
    kwargs = {"time_limit_s": milp_limit} if method == "milp" else {}
    start = time.perf_counter()
    try:
        a = allocate(layers, devices, method, **kwargs)
    except AllocationError as exc:
        return None, time.perf_counter() - start, f"fails: {str(exc)[:60]}"
    elapsed = time.perf_counter() - start
    note = ""
    if method == "milp" and not a.notes.get("proven_optimal"):
        note = "time limit"
    if method == "optimal-order" and a.gap:
        note = f"gap<={a.gap:.0%}"
    return a, elapsed, note


def real_run_table(entries: Sequence[dict]) -> str:
    """Predicted vs measured iteration time of real runs: entries with label, predicted_s, measured_s."""
    lines = ["", "Real run: predicted vs measured iteration time", f"{'run':28s} {'predicted s':>12s} "
             f"{'measured s':>11s} {'error':>7s}"]
    for e in entries:
        err = (e["predicted_s"] - e["measured_s"]) / e["measured_s"]
        lines.append(f"{e['label']:28s} {e['predicted_s']:12.4f} {e['measured_s']:11.4f} {err:+7.1%}")
    return "\n".join(lines)


def profile_section() -> str:
    """Real Paddle BERT layers profiled on the current device: counted FLOPs vs analytic, time, achieved rate."""
    import paddle

    from nebula.balance.bert import bert_layers, example_input
    from nebula.balance.profile import measure_layers

    gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    paddle.set_device("gpu" if gpu else "cpu")
    shape = preset("bert-large", num_layers=2) if gpu else preset("bert-base", num_layers=2, batch=4, seq_len=64)
    analytic = bert_costs(shape)
    prof = measure_layers(bert_layers(shape), example_input(shape), names=[c.name for c in analytic],
                          warmup=3, repeat=10)
    dev = paddle.device.get_device()
    lines = ["", f"Layer profile on {dev} ({shape.hidden} hidden, batch {shape.batch} x {shape.seq_len} tokens, "
             f"{shape.dtype}, fwd+bwd)",
             f"{'layer':10s} {'GFLOP':>9s} {'analytic':>9s} {'ms':>9s} {'TFLOP/s':>8s} {'params MiB':>11s} "
             f"{'activ. MiB':>11s} {'memory MiB':>11s}"]
    for p, a in zip(prof, analytic):
        rate = p.flops / p.time_s / 1e12 if p.time_s > 0 else float("nan")
        lines.append(f"{p.name:10s} {p.flops / 1e9:9.2f} {a.flops / 1e9:9.2f} {p.time_s * 1e3:9.3f} {rate:8.2f} "
                     f"{p.param_bytes / 2**20:11.1f} {p.activation_bytes / 2**20:11.1f} "
                     f"{p.cost().memory_bytes / 2**20:11.1f}")
    return "\n".join(lines)


MEMORY_SETTINGS = ("p100", "tight")


def main(argv: list[str] | None = None) -> int:
    """Run every instance and print the tables and the target checks."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="instances per (model, devices, memory setting)")
    ap.add_argument("--milp-limit", type=float, default=10.0, help="HiGHS time limit per instance, seconds")
    ap.add_argument("--milp-max-binaries", type=int, default=2000,
                    help="run milp only where (devices-1) x layers is at most this")
    ap.add_argument("--memory", choices=MEMORY_SETTINGS, nargs="+", default=list(MEMORY_SETTINGS),
                    help="memory settings to run (default: both)")
    ap.add_argument("--profile", action="store_true", help="add real Paddle layer profiles on this device")
    ap.add_argument("--real-run", default=None, help="JSON lines of real runs (label, predicted_s, measured_s)")
    args = ap.parse_args(argv)

    print(__doc__.split("\n\n")[0])
    records = []
    for memory in args.memory:
        ratio_hdr = (f"{'model':9s} {'dev':>3s} {'seed':>4s} | " + " ".join(f"{m:>16s}" for m in METHODS)
                     + f" | {'even/opt':>8s} {'saved':>6s} {'at most':>7s}")
        time_hdr = (f"{'model':9s} {'dev':>3s} {'seed':>4s} | " + " ".join(f"{m:>13s}" for m in METHODS)
                    + f" | {'reallocate':>10s} {'moved':>6s} {'moved@5%':>8s}")
        ratio_lines, time_lines = [], []
        for model in MODELS:
            layers = bert_costs(preset(model))
            for d in NUM_DEVICES:
                if d > len(layers):
                    skip = f"{model:9s} {d:3d}    - | skipped: {len(layers)} layers cannot give each of {d} devices one"
                    ratio_lines.append(skip)
                    time_lines.append(skip)
                    continue
                for seed in range(args.seeds):
                    rec = _instance(model, layers, d, seed, memory, args)
                    records.append(rec)
                    res, opt = rec["res"], rec["opt"]
                    cells = []
                    for m in METHODS:
                        a, _, note = res[m]
                        cells.append(f"{a.bottleneck_s / opt:6.3f} {note[:9]:>9s}" if a else f"{note[:16]:>16s}")
                    key = f"{model:9s} {d:3d} {seed:4d} | "
                    ratio_lines.append(key + " ".join(cells) + f" | {rec['even'] / opt:7.2f}x"
                                       f" {1 - opt / rec['even']:6.1%} {1 - rec['bound'] / rec['even']:7.1%}")
                    times = " ".join(f"{res[m][1]:13.4f}" if not math.isnan(res[m][1]) else f"{'-':>13s}"
                                     for m in METHODS)
                    time_lines.append(key + times + f" | {rec['realloc_s']:10.4f} {rec['moved']:6.1%}"
                                      f" {rec['moved_loose']:8.1%}")
                    print(".", end="", file=sys.stderr, flush=True)
        print(f"\n[{memory}] {MEMORY_DOC[memory]}")
        print("Predicted iteration time / optimal's (lower is better); 'even/opt': speed-up of optimal over even "
              "(even's time / optimal's); 'saved': time saved, 1 - optimal / even (the paper's '55%' is this, for "
              "sky); 'at most': 1 - lower bound / even, the most any allocator in any device order could save")
        print(ratio_hdr)
        print("-" * len(ratio_hdr))
        print("\n".join(ratio_lines))
        print(f"\n[{memory}] Run time of each allocator, seconds; 'reallocate': re-plan after the slowest device "
              "leaves, 'moved': layer bytes it moves, as a share of the model ('moved@5%': allowing a bottleneck "
              "5% above the optimum)")
        print(time_hdr)
        print("-" * len(time_hdr))
        print("\n".join(time_lines))
    print("", file=sys.stderr)
    _targets(records)
    if args.profile:
        print(profile_section())
    if args.real_run:
        with open(args.real_run, encoding="utf-8") as f:
            print(real_run_table([json.loads(line) for line in f if line.strip()]))
    return 0


MEMORY_DOC = {
    "p100": "every device has 16 GB, as the paper's P100 nodes (memory rarely binds)",
    "tight": "every device has 1x-3x (uniform) the largest stage of the even allocation (memory binds)",
}


def _instance(model: str, layers: list[LayerCost], d: int, seed: int, memory: str, args) -> dict:
    """Run every method (and a re-allocation) on one instance."""
    devices = paper_devices(layers, d, seed, memory)
    res = {}
    for m in METHODS:
        if m == "milp" and (d - 1) * len(layers) > args.milp_max_binaries:
            res[m] = (None, float("nan"), "skipped")
            continue
        res[m] = run_method(m, layers, devices, args.milp_limit)
    opt = res["optimal"][0].bottleneck_s
    gone = max(range(d), key=lambda k: devices[k].time_per_flop_s)
    rest = devices[:gone] + devices[gone + 1:]
    start = time.perf_counter()
    r = reallocate(res["optimal"][0], layers, rest, "optimal")
    realloc_s = time.perf_counter() - start
    loose = reallocate(res["optimal"][0], layers, rest, "optimal", tolerance=0.05)
    from nebula.balance.optimal_order import order_lower_bound

    return {"model": model, "devices": d, "seed": seed, "memory": memory, "res": res, "opt": opt,
            "bound": order_lower_bound(layers, devices),
            "even": res["even"][0].bottleneck_s, "realloc_s": realloc_s,
            "moved": r.moved_bytes / sum(x.memory_bytes for x in layers),
            "moved_loose": loose.moved_bytes / sum(x.memory_bytes for x in layers),
            "realloc_same": r.allocation.bottleneck_s == allocate(layers, rest, "optimal").bottleneck_s}


def _targets(records: list[dict]) -> None:
    """Print each target of the issue with the measured value and whether it holds."""
    def ok(flag: bool) -> str:
        return "yes" if flag else "NO"

    # no fixed-order method may beat optimal on its own instance, and HiGHS must find the same optimum
    exact = all(r["res"][m][0].bottleneck_s >= r["opt"] for r in records for m in ("even", "sky", "milp")
                if r["res"][m][0] is not None)
    milp_rows = [r for r in records if r["res"]["milp"][0] is not None and r["res"]["milp"][0].notes["proven_optimal"]]
    milp_agree = all(abs(r["res"]["milp"][0].bottleneck_s - r["opt"]) <= 1e-6 * r["opt"] for r in milp_rows)
    big = [r["res"]["optimal"][1] for r in records if r["model"] == "bert-160" and r["devices"] == 64]
    at64 = [1 - r["opt"] / r["even"] for r in records if r["devices"] == 64]
    at64_by = {m: [1 - r["opt"] / r["even"] for r in records if r["devices"] == 64 and r["memory"] == m]
               for m in dict.fromkeys(r["memory"] for r in records)}
    best64 = [1 - r["bound"] / r["even"] for r in records if r["devices"] == 64]
    sky_rows = [r for r in records if r["res"]["sky"][0] is not None]
    sky_not_opt = [r for r in sky_rows if r["res"]["sky"][0].bottleneck_s > r["opt"]]
    sky_worse = all(r["opt"] < r["res"]["sky"][0].bottleneck_s for r in sky_not_opt)
    sky_fail = len(records) - len(sky_rows)
    realloc = [r["realloc_s"] for r in records]
    print("\nTargets (all memory settings together)")
    print(f"  optimal = 1.00x the optimum on every instance: {ok(exact and milp_agree)} (no fixed-order method beat it "
          f"on any of {len(records)} instances: {ok(exact)}; HiGHS proved the same optimum, to its 1e-6 tolerance, on "
          f"all {len(milp_rows)} instances it finished: {ok(milp_agree)})")
    print(f"  optimal <= 1 s for 160 layers x 64 devices: {ok(max(big) <= 1.0)} (max {max(big) * 1e3:.1f} ms)")
    paper = [r for r in records if r["devices"] == 64 and r["model"] == "bert-160"]
    p_saved = [1 - r["opt"] / r["even"] for r in paper]
    p_bound = [1 - r["bound"] / r["even"] for r in paper]
    print(f"  at 64 devices >= 55% faster than even, read as the paper reads it (time saved, 1 - optimal/even >= 55%, "
          f"i.e. even/optimal >= 2.22x): {ok(min(at64) >= 0.55)} on every 64-device instance (min {min(at64):.1%}, "
          f"mean {statistics.mean(at64):.1%}, max {max(at64):.1%}; "
          + ", ".join(f"{m}: min {min(v):.1%}" for m, v in at64_by.items() if v) + ")")
    if paper:
        print(f"    the paper's instance (bert-160 x 64): saved {min(p_saved):.1%}-{max(p_saved):.1%} (speed-up "
              f"{min(1 / (1 - x) for x in p_saved):.2f}x-{max(1 / (1 - x) for x in p_saved):.2f}x), met on "
              f"{sum(x >= 0.55 for x in p_saved)} of {len(p_saved)}; of the {sum(x < 0.55 for x in p_saved)} below "
              f"55%, {sum(x < 0.55 and b < 0.55 for x, b in zip(p_saved, p_bound))} have a lower bound (any allocator, "
              f"any order) that saves less than 55% too (bound: {min(p_bound):.1%}-{max(p_bound):.1%} saved)")
    print(f"    read as a speed-up of 1.55x (even/optimal >= 1.55, i.e. >= 35.5% saved): "
          f"{ok(min(1 / (1 - x) for x in at64) >= 1.55)} (min {min(1 / (1 - x) for x in at64):.2f}x)")
    print(f"    no allocator in any device order can save more than 1 - lower bound / even: min {min(best64):.1%}, "
          f"max {max(best64):.1%} over these instances")
    print(f"  faster than sky wherever sky is not optimal: {ok(sky_worse)} (sky not optimal on {len(sky_not_opt)} of "
          f"{len(sky_rows)}; sky's Algorithm 1 failed on {sky_fail}; sky/optimal mean "
          f"{statistics.mean(r['res']['sky'][0].bottleneck_s / r['opt'] for r in sky_rows):.3f}x)")
    same = all(r["realloc_same"] for r in records)
    print(f"  re-allocation < 5 s with the optimal bottleneck: {ok(max(realloc) < 5 and same)}"
          f" (max {max(realloc):.3f} s)")


if __name__ == "__main__":
    sys.exit(main())
