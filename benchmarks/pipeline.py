"""Inter- against intra-cluster training throughput of the same model, with the switch link shaped to WAN rates.

Everything runs side by side in one invocation: a throwaway federation per link rate (real switch servers with
`link.shape` in switch.yaml), `nebula launch` per cluster, and the same job run inside one cluster (`--intra`,
with as many data-parallel ranks as the two clusters have together) as the baseline. Printed per run: median
step time, throughput, throughput relative to intra-cluster, fraction of step time waiting on the link, bytes on
the link per step, and for Scenario II the exposed communication (step time added by the shaped link against an
unshaped link, as a fraction of the step: the time spent waiting on the link itself).

Targets (issue 5): Scenario I pattern >= 0.95 of intra-cluster throughput; Scenario II exposed communication
<= 10% of the step wherever the compressed transfer takes less time than the computation.

    .venv/bin/python benchmarks/pipeline.py                 # short default run (a few minutes)
    .venv/bin/python benchmarks/pipeline.py --repeats 3     # interleaved rounds: steadier on a shared machine
    .venv/bin/python benchmarks/pipeline.py --steps 60 --rates 170,60,20 --hidden 1024
    .venv/bin/python benchmarks/pipeline.py --efficiency --repeats 3   # step time against the ideal

`--efficiency` runs Scenario II only, through links shaped to 5, 10 and 60 Mbit/s (`--rates`) with 20 ms delay each
way (`--delay-ms`), uncompressed and with the compressed codecs, and prints per rate and codec the measured step
against the ideal step max(compute, wire): compute is the busier cluster's computing time per step (step time
less the time it waits on its peer), wire the time the shaped link needs for one step's bytes in its busier
direction (each direction is shaped on its own). Target: step / ideal <= 1.1.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _federation import Federation  # benchmarks/ is this script's directory

BIN = Path(sys.executable).parent
WARMUP = 5  # first steps excluded from timings (process start, first allocations)


def _job(run_dir: Path, args: argparse.Namespace, *, oneway: bool, inter: bool, fed: Federation | None,
         codec: str) -> Path:
    stages = (["gen", "disc"] if oneway else ["embed", "head"])
    ranks = 1 if inter else 2
    doc = {
        "job": f"bench-{run_dir.name}",  # a fresh job (fresh channels) per run
        "mode": "oneway" if oneway and inter else "pipeline",
        "recipe": {"factory": "recipes.toy:ToyRecipe",
                   "args": {"dim": args.dim, "hidden": args.hidden, "depth": args.depth, "classes": 16,
                            "oneway": oneway, "num_examples": 1 << 16}},
        "clusters": [{"id": "A", "procs_per_node": ranks, **({"worker": fed.worker("A")} if fed else {})},
                     {"id": "B", "procs_per_node": ranks, **({"worker": fed.worker("B")} if fed else {})}],
        "stages": [{"name": stages[0], "cluster": "A"}, {"name": stages[1], "cluster": "B" if inter else "A"}],
        "train": {"steps": args.steps, "global_batch": args.global_batch, "micro_batches": args.micro_batches,
                  "seed": 1},
        "compression": {"forward": codec, "backward": args.backward if codec != "none" else "none"},
        "oneway": {"k": 1, "sync_lag": 1},
        "metrics": {"dir": "metrics", "progress": False},
        "peer_timeout_s": args.peer_timeout_s,
    }
    run_dir.mkdir(parents=True)
    f = run_dir / "job.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def _launch(job: Path, cluster: str, intra: bool) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [str(BIN / "nebula"), "launch", str(job), "--cluster", cluster] + (["--intra"] if intra else [])
    return subprocess.Popen(cmd, cwd=job.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _records(job: Path, cluster: str) -> list[dict]:
    f = job.parent / "metrics" / f"{cluster}.rank0.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()][WARMUP:]


def _attempt(job: Path, inter: bool) -> str | None:
    """Run a job once; None on success, else the failing launcher's output tail."""
    procs = [_launch(job, "A", not inter)] + ([_launch(job, "B", False)] if inter else [])
    failure = None
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0 and failure is None:
            failure = out[-4000:]
            for q in procs:  # the other cluster would wait for its peer until the timeout
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGTERM)
    return failure


RETRIES: list[str] = []


def run_one(job: Path, inter: bool) -> dict:
    """Run a job (both clusters, or intra in A) and summarise its timings; one retry after a failed run."""
    failure = _attempt(job, inter)
    if failure is not None:
        RETRIES.append(f"{job.parent.name}: {failure.strip().splitlines()[-1] if failure.strip() else '?'}")
        doc = yaml.safe_load(job.read_text())
        doc["job"] += "-retry"
        shutil.rmtree(job.parent / "metrics", ignore_errors=True)
        job.write_text(yaml.safe_dump(doc, sort_keys=False))
        failure = _attempt(job, inter)
        if failure is not None:
            raise RuntimeError(f"{job} failed twice:\n{failure}")
    a = _records(job, "A")
    b = _records(job, "B") if inter else a
    step = statistics.median(r["step_s"] for r in b)
    wait = max(sum(r["wait_s"] for r in recs) / sum(r["step_s"] for r in recs) for recs in (a, b))
    return {"step_s": step, "wait_frac": wait if inter else 0.0,
            "bytes_per_step": statistics.mean(r["bytes_sent"] for r in a) + (
                statistics.mean(r["bytes_sent"] for r in b) if inter else 0),
            "compute_s": max(statistics.median(r["compute_s"] for r in recs) for recs in (a, b)),
            # each direction of the link is shaped on its own: the busier one bounds the step
            "busier_direction_bytes": max(statistics.mean(r["bytes_sent"] for r in recs) for recs in (a, b))}


def efficiency(args: argparse.Namespace, root: Path) -> None:
    """Measured step against max(compute, wire) per link rate and codec (Scenario II); see the module docstring."""
    rates = [float(r) for r in args.rates.split(",") if r]
    codecs = ["none", args.codec]
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    feds = {rate: Federation(root / f"fed-{rate:g}", ["A", "B"], rate, args.delay_ms) for rate in rates}
    runs: dict[tuple, list[dict]] = {(rate, codec): [] for rate in rates for codec in codecs}
    try:
        for rep in range(args.repeats):
            for rate, codec in runs:  # every configuration once per round: load hits all alike
                job = _job(root / f"r{rep}-{rate:g}-{codec}", args, oneway=False, inter=True, fed=feds[rate],
                           codec=codec)
                runs[(rate, codec)].append(run_one(job, True))
    finally:
        for fed in feds.values():
            fed.close()
    print(f"\nmodel: toy MLP dim={args.dim} hidden={args.hidden} depth={args.depth}/stage, global batch "
          f"{args.global_batch}, {args.micro_batches} micro-batches, {args.steps} steps ({WARMUP} warm-up), two "
          f"clusters, link delay {args.delay_ms:g} ms each way, {args.repeats} alternating round(s); medians; load "
          f"average {load0} before, {' '.join(f'{x:.2f}' for x in os.getloadavg())} after")
    hdr = f"{'link':>10}{'codec':>14}{'step ms':>9}{'compute':>9}{'wire ms':>9}{'step/ideal':>12}{'efficiency':>12}"
    print(hdr)
    print("-" * len(hdr))
    for (rate, codec), rs in runs.items():
        step = statistics.median(r["step_s"] for r in rs)
        compute = statistics.median(r["compute_s"] for r in rs)
        wire = statistics.median(r["busier_direction_bytes"] for r in rs) * 8 / (rate * 1e6)
        ideal = max(compute, wire)
        codec_s = codec if codec == "none" else f"{codec}/{args.backward}"
        print(f"{f'{rate:g} Mb/s':>10}{codec_s:>14}{step * 1e3:>9.1f}{compute * 1e3:>9.1f}{wire * 1e3:>9.1f}"
              f"{step / ideal:>12.2f}{ideal / step:>12.2f}")
    print("step/ideal: measured step / max(compute, wire) (target <= 1.1); efficiency: its inverse")


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--rates", default="170,60", help="shaped link rates in Mbit/s")
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--depth", type=int, default=4, help="hidden layers per stage (compute per boundary byte)")
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--codec", default="fp16", help="forward codec of the compressed runs")
    ap.add_argument("--backward", default="int8", help="backward codec of the compressed runs")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved rounds; medians over rounds are printed")
    ap.add_argument("--peer-timeout-s", type=float, default=40.0)
    ap.add_argument("--keep", default=None, help="keep run directories here (default: a temporary directory)")
    ap.add_argument("--efficiency", action="store_true", help="step time against max(compute, wire); see above")
    args = ap.parse_args(argv)
    if args.efficiency:
        if "--rates" not in (argv if argv is not None else sys.argv):
            args.rates = "5,10,60"
        if "--delay-ms" not in (argv if argv is not None else sys.argv):
            args.delay_ms = 20.0
        root = Path(args.keep or tempfile.mkdtemp(prefix="nebula-bench-efficiency-"))
        root.mkdir(parents=True, exist_ok=True)
        try:
            efficiency(args, root)
        finally:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        return 0
    rates: list[float | None] = [None] + [float(r) for r in args.rates.split(",") if r]
    root = Path(args.keep or tempfile.mkdtemp(prefix="nebula-bench-pipeline-"))
    root.mkdir(parents=True, exist_ok=True)
    n = 0

    def fresh(name: str) -> Path:
        nonlocal n
        n += 1
        return root / f"{n:02d}-{name}"

    # every configuration once per round, rounds interleaved, so load from other processes hits all alike
    configs: list[tuple] = [("II", "intra", "none"), ("I", "intra", "none")]
    for rate in rates:
        configs += [("II", rate, "none"), ("II", rate, args.codec)] + ([("I", rate, "none")] if rate else [])
    feds = {rate: Federation(fresh(f"fed-{rate or 'unshaped'}"), ["A", "B"], rate, args.delay_ms) for rate in rates}
    runs: dict[tuple, list[dict]] = {c: [] for c in configs}
    try:
        for _ in range(args.repeats):
            for cfg in configs:
                m, rate, codec = cfg
                inter = rate != "intra"
                job = _job(fresh(f"{m}-{rate}-{codec}"), args, oneway=(m == "I"), inter=inter,
                           fed=feds[rate] if inter else None, codec=codec)
                runs[cfg].append(run_one(job, inter))
    finally:
        for fed in feds.values():
            fed.close()
    med = {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in runs.items()}
    intra = {m: med[(m, "intra", "none")] for m in ("II", "I")}
    results = {c: r for c, r in med.items() if c[1] != "intra"}

    gb = args.global_batch
    print(f"\nmodel: toy MLP dim={args.dim} hidden={args.hidden} depth={args.depth}/stage, global batch {gb}, "
          f"{args.micro_batches} micro-batches, {args.steps} steps ({WARMUP} warm-up), {args.repeats} round(s), "
          f"link delay {args.delay_ms:g} ms, OMP_NUM_THREADS=1")
    print("intra = same model, one cluster, 2 data-parallel ranks; inter = 1 rank per cluster through the switches\n")
    hdr = (f"{'scenario':<10}{'link':>10}{'codec':>14}{'step ms':>9}{'ex/s':>8}{'vs intra':>9}{'blocked':>8}"
           f"{'KB/step':>9}{'link ms':>8}{'exposed':>9}")
    print(hdr)
    print("-" * len(hdr))
    for m in ("II", "I"):
        r = intra[m]
        print(f"{m:<10}{'intra':>10}{'-':>14}{r['step_s'] * 1e3:>9.1f}{gb / r['step_s']:>8.0f}{1.0:>9.2f}"
              f"{'-':>8}{'-':>9}{'-':>8}{'-':>9}")
        for (mm, rate, codec), res in results.items():
            if mm != m:
                continue
            link_ms = res["bytes_per_step"] * 8 / (rate * 1e6) * 1e3 if rate else 0.0
            exposed = "-"
            base = results.get((m, None, codec))
            if m == "II" and rate and base:
                exposed = f"{max(0.0, res['step_s'] - base['step_s']) / res['step_s']:.1%}"
            codec_s = codec if codec == "none" else f"{codec}/{args.backward}"
            print(f"{m:<10}{(f'{rate:g} Mb/s' if rate else 'unshaped'):>10}{codec_s:>14}"
                  f"{res['step_s'] * 1e3:>9.1f}{gb / res['step_s']:>8.0f}{r['step_s'] / res['step_s']:>9.2f}"
                  f"{res['wait_frac']:>8.0%}{res['bytes_per_step'] / 1024:>9.0f}{link_ms:>8.1f}{exposed:>9}")
    print("\nvs intra: throughput / intra-cluster throughput (target Scenario I >= 0.95)")
    print("blocked: fraction of step time a rank waits on its peer (link transfer, peer compute, pipeline bubbles),"
          " worst of the two clusters")
    print("link ms: time the shaped link needs for one step's bytes (both directions, serialised)")
    print("exposed: the part of the step spent waiting on the link itself = step time added by the shaped link over "
          "the unshaped one (target Scenario II <= 10% where link ms < compute)")
    for r in RETRIES:
        print(f"retried after a failed run: {r}")
    if args.keep:
        print(f"runs kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
