"""Predicted against measured iteration time of real layer-pipelined runs cut by an allocation.

Each run starts 4 worker processes with `nebula launch` (paddle.distributed.launch, gloo on CPU) as a 4-stage
layer pipeline of the toy MLP, with simulated slowdowns per rank (compute takes factor x as long, as in Sky
Computing's speed control). Before training every rank benchmarks itself: ping-pong latency and bandwidth to its
neighbour, the all-reduce that ends a step, and every layer's forward, backward and optimizer step on this rank
(one warm-up round, then rounds for a fixed time budget, median per layer; slowdown applied as in training). The
allocator cuts the layers; the prediction replays the runner's GPipe schedule on the layer times of each stage's
own rank: fill and drain ((M + S - 1) x the bottleneck for equal stages), header + activation forward and gradient
back on each link, optimizer step, and the closing all-reduce (nebula.hybrid.schedule); where the ranks of a host
outnumber its cores, the schedule is replayed with the computing ranks sharing the cores (a slowed rank's sleep
leaves its core to the others). Measured: the median step on rank 0 after `--warmup` steps (every rank ends a step
together: the loss is all-reduced).

    .venv/bin/python benchmarks/allocation_run.py [--steps 8 --slowdowns 1,3,1,2 --methods even,optimal
                                                   --probe together,alone]

BLAS and OpenMP threads are pinned to 1 in every rank (probe and run alike). Probe `together` (default, as the
runtime does where a host's ranks outnumber its cores) times all ranks at once (the contention they will see in
training is measured); `alone` times each rank's layers by itself (each device's own speed; the schedule model adds
the sharing of cores). The load average is printed before and after each run: other processes on the host are neither
measured nor modelled and change the measured times.
"""
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # every rank inherits it: probe and run on one thread alike

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run_once(work: Path, *, method: str, slowdowns: list[float], steps: int, layers: int, hidden: int,
             batch: int, micro_batches: int, warmup: int, together: bool) -> dict:
    """One real run; its plan (cut, predicted step) and its measured median step time."""
    work.mkdir(parents=True, exist_ok=True)
    ranks = len(slowdowns)
    job = {
        "job": f"alloc-{method}",
        "recipe": {"factory": "recipes.toy:ToyRecipe", "args": {"num_layers": layers, "hidden": hidden, "dim": 64}},
        "clusters": [{"id": "A", "procs_per_node": ranks,
                      "pipeline": {"num_stages": ranks, "allocation": method, "slowdown": slowdowns,
                                   "probe_together": together}}],
        "stages": [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}],
        "train": {"steps": steps, "global_batch": batch, "micro_batches": micro_batches, "seed": 1},
        "metrics": {"dir": "metrics", "progress": False},
    }
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    nebula = Path(sys.executable).parent / "nebula"
    load_before, t0 = _load(), time.monotonic()
    proc = subprocess.run([str(nebula), "launch", str(path), "--cluster", "A"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"run {method} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    plan = json.loads((work / "metrics" / "A.plan.json").read_text())
    recs = [json.loads(line) for line in (work / "metrics" / "A.rank0.jsonl").read_text().splitlines()]
    measured = statistics.median(r["step_s"] for r in recs if r["step"] >= warmup)
    # per stage: compute (forward + backward, slowdown included) per micro-batch, predicted vs measured in the run
    stage_meas = []
    for rank in range(ranks):
        rr = [json.loads(line) for line in (work / "metrics" / f"A.rank{rank}.jsonl").read_text().splitlines()]
        stage_meas.append(statistics.median(r["compute_s"] for r in rr if r["step"] >= warmup) / micro_batches)
    stage_pred = [c["forward_s"] + c["backward_s"] for c in plan["stage_costs"]]
    return {"method": method, "probe": "together" if together else "alone", "bounds": plan["bounds"],
            "predicted_s": plan["predicted_step_s"], "measured_s": measured, "stage_pred": stage_pred,
            "stage_meas": stage_meas, "loss": recs[-1]["loss"], "cores": plan["cores"], "load": f"{load_before} -> {_load()}",
            "wall_s": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    """Run each method and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--slowdowns", default="1,3,1,2", help="compute factor per rank (4 ranks by default)")
    ap.add_argument("--methods", default="even,optimal")
    ap.add_argument("--probe", default="together", help="probe modes, comma-separated: together, alone")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--workdir", default=None, help="keep the runs' files here (default: a temporary directory)")
    args = ap.parse_args(argv)
    slowdowns = [float(x) for x in args.slowdowns.split(",")]
    rows = []
    start = time.monotonic()
    print(f"host: {os.cpu_count()} cores, load average (1/5/15 min) {_load()} at the start", flush=True)
    with tempfile.TemporaryDirectory(prefix="nebula-alloc-run-") as tmp:
        tmp = args.workdir or tmp
        for together in [m.strip() == "together" for m in args.probe.split(",")]:
            for method in args.methods.split(","):
                name = f"{method}-{'together' if together else 'alone'}"
                rows.append(run_once(Path(tmp) / name, method=method, slowdowns=slowdowns, steps=args.steps,
                                     layers=args.layers, hidden=args.hidden, batch=args.batch,
                                     micro_batches=args.micro_batches, warmup=args.warmup, together=together))
                print(f"  {name}: done in {rows[-1]['wall_s']:.0f} s, load average {rows[-1]['load']}", flush=True)
    print(f"real runs: {len(slowdowns)} worker processes (paddle.distributed.launch, gloo), toy MLP "
          f"{args.layers} layers x {args.hidden}, batch {args.batch} in {args.micro_batches} micro-batches, "
          f"slowdowns {slowdowns}, median of steps {args.warmup}..{args.steps - 1}; the stages share "
          f"{rows[0]['cores']:g} cores in the prediction")
    print(f"{'method':<8} {'probe':<9} {'bounds':<22} {'predicted s':>11} {'measured s':>10} {'pred/meas':>9}  "
          f"{'stage compute per micro-batch, ms: predicted/measured':<54} {'load average before -> after'}")
    for r in rows:
        stages = " ".join(f"{p * 1e3:.0f}/{m * 1e3:.0f}" for p, m in zip(r["stage_pred"], r["stage_meas"]))
        print(f"{r['method']:<8} {r['probe']:<9} {str(r['bounds']):<22} {r['predicted_s']:>11.3f} "
              f"{r['measured_s']:>10.3f} {r['predicted_s'] / r['measured_s']:>9.2f}  {stages:<54} {r['load']}")
    for mode in dict.fromkeys(r["probe"] for r in rows):
        worst = max(abs(r["predicted_s"] / r["measured_s"] - 1) for r in rows if r["probe"] == mode)
        print(f"probe {mode}: worst |predicted/measured - 1| = {worst:.1%} (target 10%: "
              f"{'met' if worst <= 0.10 else 'NOT met'})")
    by = {(r["method"], r["probe"]): r["measured_s"] for r in rows}
    for mode in dict.fromkeys(r["probe"] for r in rows):
        if ("even", mode) in by and ("optimal", mode) in by:
            print(f"probe {mode}: measured even / optimal = {by[('even', mode)] / by[('optimal', mode)]:.2f}x")
    print(f"host: {os.cpu_count()} cores, load average (1/5/15 min) {_load()} at the end; "
          f"total {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
