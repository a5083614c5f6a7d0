"""Predicted against measured iteration time of real layer-pipelined runs cut by an allocation.

Each run starts 4 worker processes with `nebula launch` (paddle.distributed.launch, gloo on CPU) as a 4-stage
layer pipeline of the toy MLP, with simulated slowdowns per rank (compute takes factor x as long, as in Sky
Computing's speed control). The ranks benchmark themselves (probe forward+backward, ping-pong to the neighbour),
rank 0 measures the layers, the allocator cuts the layers, and the runtime writes the predicted step time (GPipe:
sum of per-micro-batch stage times + (M-1) x the slowest) beside the measured steps.

    .venv/bin/python benchmarks/allocation_run.py [--steps 8 --slowdowns 1,3,1,2 --methods even,optimal
                                                   --probe alone,together]

BLAS threads are pinned to 1 per rank; the measured time is the median step after `--warmup` steps, on rank 0
(every rank ends a step together: the step's loss is all-reduced). Probe `alone` times each rank by itself (the
device's own speed, what an allocation between separate machines needs); `together` times all ranks at once,
which on one host with fewer cores than ranks includes the contention the run will have.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from nebula.hybrid.costs import pipeline_time_s

REPO = Path(__file__).resolve().parent.parent


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
    proc = subprocess.run([str(nebula), "launch", str(path), "--cluster", "A"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"run {method} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    plan = json.loads((work / "metrics" / "A.plan.json").read_text())
    recs = [json.loads(line) for line in (work / "metrics" / "A.rank0.jsonl").read_text().splitlines()]
    measured = statistics.median(r["step_s"] for r in recs if r["step"] >= warmup)
    # the schedule model alone: the same GPipe formula on the stage compute the ranks measured in this run
    stage_compute = []
    for rank in range(ranks):
        rr = [json.loads(line) for line in (work / "metrics" / f"A.rank{rank}.jsonl").read_text().splitlines()]
        stage_compute.append(statistics.median(r["compute_s"] for r in rr if r["step"] >= warmup) / micro_batches)
    model_s = pipeline_time_s(stage_compute, micro_batches)
    return {"method": method, "probe": "together" if together else "alone", "bounds": plan["bounds"], "predicted_s": plan["predicted_step_s"],
            "measured_s": measured, "model_s": model_s, "stage_s": plan["predicted_stage_s"],
            "tpf": [p["compute_s"] / p["probe_flops"] for p in plan["probes"]], "loss": recs[-1]["loss"]}


def main(argv: list[str] | None = None) -> int:
    """Run each method and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--slowdowns", default="1,3,1,2", help="compute factor per rank (4 ranks by default)")
    ap.add_argument("--methods", default="even,optimal")
    ap.add_argument("--probe", default="alone,together", help="probe modes: ranks timed one at a time or at once")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--workdir", default=None, help="keep the runs' files here (default: a temporary directory)")
    args = ap.parse_args(argv)
    slowdowns = [float(x) for x in args.slowdowns.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="nebula-alloc-run-") as tmp:
        tmp = args.workdir or tmp
        for together in [m == "together" for m in args.probe.split(",")]:
            for method in args.methods.split(","):
                name = f"{method}-{'together' if together else 'alone'}"
                rows.append(run_once(Path(tmp) / name, method=method, slowdowns=slowdowns, steps=args.steps,
                                     layers=args.layers, hidden=args.hidden, batch=args.batch,
                                     micro_batches=args.micro_batches, warmup=args.warmup, together=together))
    print(f"real runs: {len(slowdowns)} worker processes (paddle.distributed.launch, gloo), toy MLP "
          f"{args.layers} layers x {args.hidden}, batch {args.batch} in {args.micro_batches} micro-batches, "
          f"slowdowns {slowdowns}, median of steps {args.warmup}..{args.steps - 1}")
    print(f"{'method':<10} {'probe':<9} {'bounds':<22} {'s/FLOP per rank (probe)':<36} {'predicted s':>11} "
          f"{'measured s':>10} {'pred/meas':>9} {'model s':>8} {'model/meas':>10}")
    for r in rows:
        ratio = r["predicted_s"] / r["measured_s"]
        tpf = " ".join(f"{t:.2g}" for t in r["tpf"])
        print(f"{r['method']:<10} {r['probe']:<9} {str(r['bounds']):<22} {tpf:<36} {r['predicted_s']:>11.3f} "
              f"{r['measured_s']:>10.3f} {ratio:>9.2f} {r['model_s']:>8.3f} {r['model_s'] / r['measured_s']:>10.2f}")
    for mode in dict.fromkeys(r["probe"] for r in rows):
        worst = max(abs(r["predicted_s"] / r["measured_s"] - 1) for r in rows if r["probe"] == mode)
        print(f"probe {mode}: worst |predicted/measured - 1| = {worst:.1%} (target 10%: "
              f"{'met' if worst <= 0.10 else 'NOT met'})")
    print("model s: the GPipe formula on the per-stage compute measured during the run itself (schedule model "
          "alone, without the device benchmark's error)")
    print(f"host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
