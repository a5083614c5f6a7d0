"""Nebula-I Table 5 through the real system: ABNet trained across two clusters and two switch servers per codec pair.

Every row is a real two-cluster job: `nebula launch` starts cluster A (encoder stage) and cluster B (decoder stage)
with their ranks in `paddle.distributed.launch` process groups; activations and gradients cross the two switch
servers (mutual TLS, link shaper at --rate-mbit, 60 Mbit/s as in the paper) encoded by the row's codecs. Step time
is what the runtime measures per step and writes to its metrics files (cluster A rank 0's `step_s`: its step spans
sending the first activation to receiving the last gradient, so the link, the codecs and their overlap are in it).
Each row runs --seeds times (different data order and initial adapters); the table gives mean and spread.
BLAS threads are pinned to one (OPENBLAS/OMP/MKL_NUM_THREADS=1) in this process and every rank, so a shared CPU
does not turn threaded LAPACK spinning into step time.

`--paper-shape` prints the communication-only table at the paper's boundary shape [128, 64, 768] instead: codec
time (pinned, median of --reps) plus the time the step's bytes take through the same two switch servers.

    python benchmarks/abnet_table5.py [--steps 60] [--seeds 3] [--rows key|all] [--procs 2] [--bleu] [--work runs/table5]
    python benchmarks/abnet_table5.py --paper-shape [--rows key|all]
"""
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy loads its BLAS; inherited by every process started below

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
from _federation import Federation  # benchmarks/ is this script's directory

BIN = Path(sys.executable).parent

PAPER = {  # Table 5 of Nebula-I: BLEU, forward ratio, backward ratio, seconds per step
    "baseline": (43.19, 1.00, 1.00, 4.42), "FP16+INT8": (38.82, 0.50, 0.25, 1.60),
    "FP16(SVD(0.9))+INT8": (39.71, 0.45, 0.25, 2.10), "FP16(SVD(0.8))+INT8": (41.15, 0.40, 0.25, 1.50),
    "FP16(SVD(0.7))+INT8": (40.74, 0.34, 0.25, 1.56), "FP16(SVD(0.6))+INT8": (41.92, 0.30, 0.25, 1.42),
    "FP16(SVD(0.5))+INT8": (39.45, 0.25, 0.25, 1.24), "FP16(SVD(0.4))+INT8": (39.56, 0.20, 0.25, 0.94),
    "FP16(SVD(0.3))+INT8": (37.48, 0.15, 0.25, 0.90), "FP16(SVD(0.2))+INT8": (39.00, 0.09, 0.25, 0.86),
}
# The smallest pair measured at the demo's shapes: 4-bit activations, rank-4 INT8 gradient factors with error
# feedback (0.09-0.13 of float32 bytes at [8, T, 64], T = 4..16; benchmarks/compression.py shapes, see the README).
SMALL_PAIR = ("INT4_BLOCK+EF(INT8(LOWRANK(4)))", "int4_block(64)", "ef(int8(lowrank(rank=4)))")

Row = tuple[str, str, str, int]  # name, forward codec, backward codec, start step


def rows(which: str) -> list[Row]:
    """(name, forward, backward, start step) of the key rows (baseline, FP16+INT8, SVD 0.6 and 0.2, the small pair)
    or of all rows (every paper ratio and nebula.compress's better pairs)."""
    ratios = (0.6, 0.2) if which == "key" else (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
    out: list[Row] = [("baseline", "none", "none", 0), ("FP16+INT8", "fp16", "int8", 0)]
    out += [(f"FP16(SVD({r}))+INT8", f"fp16(svd({r}))", "int8", 0) for r in ratios]
    if which == "all":
        out += [("INT8+INT8", "int8", "int8", 0), ("INT8_BLOCK+EF(INT8_BLOCK)", "int8_block(64)", "ef(int8_block(64))", 0),
                ("INT4_BLOCK+EF(INT4_BLOCK)", "int4_block(64)", "ef(int4_block(128))", 0)]
    out.append((*SMALL_PAIR, 0))
    return out


def write_job(run: Path, work: Path, fed: Federation, row: Row, seed: int, steps: int, procs: int) -> Path:
    """train.yaml and job.yaml of one row and seed (the demo job of run_local.sh with this row's codecs)."""
    import yaml

    name, fwd, bwd, start = row
    run.mkdir(parents=True, exist_ok=True)
    train = yaml.safe_load(train_config(work).read_text())
    train.update(steps=steps, seed=seed)
    (run / "train.yaml").write_text(yaml.safe_dump(train, sort_keys=False))
    job = {
        "job": "table5", "mode": "pipeline",
        "recipe": {"factory": "recipes.abnet:ABNetRecipe",
                   "args": {"config": str(run / "train.yaml"), "encoder_data": str(work / "data" / "A"),
                            "encoder_work": str(work / "A"), "decoder_data": str(work / "data" / "B"),
                            "decoder_work": str(work / "B")}},
        "clusters": [{"id": c, "device": "cpu", "nodes": 1, "procs_per_node": procs, "worker": str(fed.worker(c))}
                     for c in ("A", "B")],
        "stages": [{"name": "encoder", "cluster": "A"}, {"name": "decoder", "cluster": "B"}],
        "train": {"steps": steps, "global_batch": 32, "micro_batches": 2, "seed": seed},
        "compression": {"forward": fwd, "backward": bwd, "start_step": start},
        "checkpoint": {"dir": str(run / "ckpt"), "every": 0, "keep": 1, "resume": False},
        "metrics": {"dir": str(run / "metrics"), "progress": False},
        "peer_timeout_s": 180,
    }
    f = run / "job.yaml"
    f.write_text(yaml.safe_dump(job, sort_keys=False))
    return f


def run_both(cmds: dict[str, list[str]], logs: dict[str, Path], cwd: Path, timeout_s: float, what: str) -> None:
    """Run one command per cluster at once, each in its own process group with its output in `logs[c]`; wait up to
    `timeout_s` for both, stop what is left, and raise with the tail of the output of any that failed."""
    ps = {}
    for c, cmd in cmds.items():
        with open(logs[c], "w") as log:
            ps[c] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(cwd), start_new_session=True)
    deadline = time.time() + timeout_s
    try:
        for p in ps.values():
            p.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in ps.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
    bad = {c: p.returncode for c, p in ps.items() if p.returncode != 0}
    if bad:
        tails = "\n".join(f"--- cluster {c} ---\n" + logs[c].read_text()[-3000:] for c in bad)
        raise RuntimeError(f"{what}: clusters exited {bad}\n{tails}")


def run_job(job: Path, timeout_s: float) -> None:
    """Start both clusters with `nebula launch`, wait for both; on failure raise with the tail of their output."""
    run_both({c: [str(BIN / "nebula"), "launch", str(job), "--cluster", c] for c in ("A", "B")},
             {c: job.parent / f"launch_{c}.log" for c in ("A", "B")}, job.parent, timeout_s, str(job))


def eval_run(run: Path, work: Path, fed: Federation, timeout_s: float) -> dict:
    """BLEU of one trained run on the held-out test split, as the main job scores it: cluster A encodes the test
    sentences with its trained adapters and sends them through the switches, cluster B translates and scores."""
    cmds = {c: [sys.executable, "-m", "recipes.abnet.remote", "eval", "--side", side, "--worker", str(fed.worker(c)),
                "--peer", peer, "--data", str(work / "data" / c), "--work", str(work / c), "--ckpt",
                str(run / "ckpt"), "--config", str(run / "train.yaml"), "--job", "table5", "--out",
                str(run / "eval.json"), "--timeout", str(timeout_s)]
            for c, side, peer in (("A", "encoder", "B"), ("B", "decoder", "A"))}
    run_both(cmds, {c: run / f"eval_{c}.log" for c in cmds}, REPO, timeout_s + 60, f"{run}: evaluation")
    ev = json.loads((run / "eval.json").read_text())
    return {"bleu": ev["bleu_after"], "bleu_before": ev["bleu_before"], "num_test": ev["num_test"]}


def read_run(run: Path, procs: int, warmup: int) -> dict:
    """Per-step figures of one run from the metrics files the runtime wrote."""
    from nebula.pipeline import read_metrics

    recs = {(c, r): read_metrics(run / "metrics" / f"{c}.rank{r}.jsonl") for c in ("A", "B") for r in range(procs)}
    a0 = recs[("A", 0)]
    step_s = [r["step_s"] for r in a0[warmup:]]
    fwd = [sum(x["bytes_sent"] for x in step) for step in zip(*(recs[("A", r)] for r in range(procs)))]
    bwd = [sum(x["bytes_sent"] for x in step) for step in zip(*(recs[("B", r)] for r in range(procs)))]
    codec = [sum(x["codec_s"] for x in step) for step in zip(*(recs[(c, r)] for c in "AB" for r in range(procs)))]
    return {"step_s": step_s, "step_s_b": [r["step_s"] for r in recs[("B", 0)][warmup:]],
            "losses": [r["loss"] for r in recs[("B", 0)]], "fwd_bytes": float(np.mean(fwd[warmup:])),
            "bwd_bytes": float(np.mean(bwd[warmup:])), "codec_s": float(np.mean(codec[warmup:]))}


def mean_sd(values: list[float], fmt: str) -> str:
    """'mean ± sd' over seeds (sd 0 with one seed)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{format(statistics.fmean(values), fmt)} ± {format(sd, fmt)}"


def train_config(work: Path) -> Path:
    """The demo's training config (recipes/abnet/configs/tiny.yaml); under NEBULA_SMOKE a copy in `work` with the
    bases pretrained for 20 steps and BLEU on 20 test sentences (every stage still runs)."""
    import yaml

    from nebula import smoke

    tiny = REPO / "recipes" / "abnet" / "configs" / "tiny.yaml"
    if not smoke.active():
        return tiny
    cfg = yaml.safe_load(tiny.read_text())
    cfg.update(pretrain_steps=min(cfg["pretrain_steps"], 20), eval_limit=20)
    out = work / "tiny-smallest.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def smallest(args: argparse.Namespace) -> argparse.Namespace:
    """`args` capped at the smallest size that still runs every row, stage and table (NEBULA_SMOKE, nebula/smoke.py:
    how CI runs the printed commands): one seed of 6 steps (2 untimed) on one rank per cluster, Figure 10's later
    starts within them, one codec timing per row."""
    from nebula import smoke

    steps = int(smoke.cap(args.steps, 6))
    fig10 = ",".join(str(smoke.cap(int(s), steps // 2)) for s in args.fig10.split(",") if s)
    return argparse.Namespace(**{**vars(args), "steps": steps, "warmup": smoke.cap(args.warmup, 2),
                                 "seeds": smoke.cap(args.seeds, 1), "procs": smoke.cap(args.procs, 1),
                                 "reps": smoke.cap(args.reps, 1), "fig10": fig10})


def prepare(work: Path) -> None:
    """The demo's data split and both frozen bases, once for every row (cluster A and B keep their own sides)."""
    from recipes.text.catalogs import DataConfig, prepare_data

    data = work / "data"
    if not (data / "A" / "en-es" / "manifest.json").is_file():
        prepare_data(data / "A", data / "B", ["es"],
                     cfg=DataConfig(max_words=6, vocab_top_k=300, test_per_mille=100, dev_per_mille=50))
    cfg = train_config(work)
    for side, c in (("encoder", "A"), ("decoder", "B")):
        with open(work / f"prepare_{c}.log", "w") as log:
            done = subprocess.run([sys.executable, "-m", "recipes.abnet.prepare", "base", "--side", side, "--data",
                                   str(data / c), "--work", str(work / c), "--config", str(cfg)], cwd=str(REPO),
                                  stdout=log, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise RuntimeError(f"pretraining the {side} base failed; see {work / f'prepare_{c}.log'}")


def training_table(args: argparse.Namespace, specs: list[Row]) -> list[str]:
    """Run every row and seed through the real system; the table's lines."""
    work = Path(args.work).resolve()
    prepare(work)
    results: dict[str, list[dict]] = {}
    tmp = tempfile.TemporaryDirectory(prefix="table5-fed-")
    fed = Federation(Path(tmp.name), ["A", "B"], args.rate_mbit, args.delay_ms, name="table5")
    try:
        for row in specs:
            for seed in range(args.seeds):
                run = work / "runs" / f"{row[0]}" / f"seed{seed}"
                t0 = time.time()
                run_job(write_job(run, work, fed, row, seed, args.steps, args.procs), args.timeout)
                res = read_run(run, args.procs, args.warmup)
                if args.bleu:
                    res.update(eval_run(run, work, fed, 300.0))
                results.setdefault(row[0], []).append(res)
                print(f"{row[0]} seed {seed}: {np.mean(res['step_s']):.4f} s/step, "
                      f"{res['fwd_bytes'] + res['bwd_bytes']:,.0f} B/step"
                      + (f", BLEU {res['bleu']:.2f}" if args.bleu else "") + f" ({time.time() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
            (work / "table5.json").write_text(json.dumps(results))
    finally:
        fed.close()
        tmp.cleanup()
    base = results[specs[0][0]]
    base_step = statistics.fmean(float(np.mean(r["step_s"])) for r in base)
    base_f = statistics.fmean(r["fwd_bytes"] for r in base)
    base_b = statistics.fmean(r["bwd_bytes"] for r in base)
    lines = [f"ABNet tiny preset, two clusters x {args.procs} ranks through two switch servers shaped to "
             f"{args.rate_mbit:g} Mbit/s (+{args.delay_ms:g} ms), {args.steps} steps x global batch 32 "
             f"(2 micro-batches per rank), {args.seeds} seeds per row, steps {args.warmup}+ timed; BLAS threads 1"
             + (f"; BLEU on the {base[0]['num_test']} test sentences" if args.bleu else ""),
             "",
             "| method | paper fwd / bwd ratio | fwd bytes vs baseline | bwd bytes vs baseline | WAN bytes/step | "
             "codec s/step | step s (mean ± sd over seeds) | step vs baseline | paper step vs baseline | "
             "final loss (last 5) |" + (" BLEU test (mean ± sd) | paper BLEU |" if args.bleu else ""),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if args.bleu else "")]
    for name, fwd, bwd, _ in specs:
        rs = results[name]
        steps = [float(np.mean(r["step_s"])) for r in rs]
        paper = PAPER.get(name)
        lines.append(
            f"| {name} | {f'{paper[1]:.2f} / {paper[2]:.2f}' if paper else '-'} | "
            f"{statistics.fmean(r['fwd_bytes'] for r in rs) / base_f:.3f} | "
            f"{statistics.fmean(r['bwd_bytes'] for r in rs) / base_b:.3f} | "
            f"{statistics.fmean(r['fwd_bytes'] + r['bwd_bytes'] for r in rs):,.0f} | "
            f"{statistics.fmean(r['codec_s'] for r in rs):.4f} | {mean_sd(steps, '.4f')} | "
            f"{statistics.fmean(steps) / base_step:.2f} | {f'{paper[3] / 4.42:.2f}' if paper else '-'} | "
            f"{mean_sd([float(np.mean(r['losses'][-5:])) for r in rs], '.3f')} |"
            + (f" {mean_sd([r['bleu'] for r in rs], '.2f')} | {f'{paper[0]:.2f}' if paper else '-'} |"
               if args.bleu else ""))
    try:
        from recipes.abnet.evaluate import plot_losses

        curves = {n: list(np.mean([r["losses"] for r in results[n]], axis=0)) for n, *_ in specs}
        plot_losses(curves, work / "table5_losses.png", title="ABNet training loss per codec pair (mean over seeds)")
        lines += ["", f"Figure 9 (loss per step, mean over seeds): {work / 'table5_losses.png'}"]
    except ImportError:
        pass
    return lines


def activation_like(shape: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    """A few strong directions plus noise (encoder outputs are far from full rank)."""
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((48, shape[-1])).astype("float32")
    h = (rng.standard_normal((shape[0] * shape[1], 48)).astype("float32") @ basis).reshape(shape)
    return h + 0.1 * rng.standard_normal(shape).astype("float32")


def paper_shape_table(args: argparse.Namespace, specs: list[Row]) -> list[str]:
    """Communication per step at [128, 64, 768]: pinned codec time plus the bytes' time through the shaped switches."""
    import logging

    from nebula.channel import Endpoint
    from nebula.compress import decode_encoded, get_codec

    logging.getLogger("nebula.compress").setLevel(logging.ERROR)
    h = activation_like((128, 64, 768))
    g = (1e-3 * np.random.default_rng(1).standard_normal(h.shape)).astype("float32")
    raw = h.nbytes
    tmp = tempfile.TemporaryDirectory(prefix="table5-fed-")
    fed = Federation(Path(tmp.name), ["A", "B"], args.rate_mbit, args.delay_ms, name="table5")
    a = b = None
    try:
        a = Endpoint.connect(fed.worker("A"), job="table5", rank=0)
        b = Endpoint.connect(fed.worker("B"), job="table5", rank=0)
        ab, ab_rx = a.channel("B", 0, "act"), b.channel("A", 0, "act")
        ba, ba_rx = b.channel("A", 0, "grad"), a.channel("B", 0, "grad")

        def transfer(fwd_bytes: int, bwd_bytes: int) -> float:
            t0 = time.perf_counter()
            ab.send(b"\x01" * fwd_bytes)
            ab_rx.recv(timeout_s=300)
            ba.send(b"\x02" * bwd_bytes, lane="gradient")
            ba_rx.recv(timeout_s=300)
            return time.perf_counter() - t0

        transfer(1000, 1000)  # links up
        lines = [f"Communication per step at the paper's boundary shape [128, 64, 768] (activation-like tensor; "
                 f"gradient 1e-3 noise), through two switch servers shaped to {args.rate_mbit:g} Mbit/s; codec time "
                 f"= median of {args.reps} encode+decode runs with BLAS threads 1", "",
                 "| method | fwd ratio | bwd ratio | bytes/step | codec s | transfer s | comm s | vs baseline | "
                 "paper step vs baseline |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        base = None
        for name, fspec, bspec, _ in specs:
            times = []
            for _ in range(args.reps):
                fc, bc = get_codec(fspec), get_codec(bspec)
                t0 = time.perf_counter()
                fe = fc.encode(h)
                decode_encoded(fe)
                ge = bc.encode(g)
                decode_encoded(ge)
                times.append(time.perf_counter() - t0)
            codec_s = statistics.median(times)
            xfer = transfer(fe.nbytes, ge.nbytes)
            comm = codec_s + xfer
            base = comm if base is None else base
            paper = PAPER.get(name)
            lines.append(f"| {name} | {fe.nbytes / raw:.3f} | {ge.nbytes / raw:.3f} | {fe.nbytes + ge.nbytes:,} | "
                         f"{codec_s:.3f} | {xfer:.2f} | {comm:.2f} | {comm / base:.2f} | "
                         f"{f'{paper[3] / 4.42:.2f}' if paper else '-'} |")
        return lines
    finally:
        for ep in (a, b):
            if ep is not None:
                ep.close(flush_s=2)
        fed.close()
        tmp.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Print the requested table (and write it under --work)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="training steps per run")
    p.add_argument("--seeds", type=int, default=3, help="runs per row (seeds 0..N-1)")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of the step time")
    p.add_argument("--rows", choices=("key", "all"), default="key")
    p.add_argument("--procs", type=int, default=2, help="ranks per cluster (the demo job: 2)")
    p.add_argument("--work", default=str(REPO / "runs" / "table5"))
    p.add_argument("--rate-mbit", type=float, default=60.0)
    p.add_argument("--delay-ms", type=float, default=10.0, help="one-way delay the shaper adds (run_local.sh: 10)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    p.add_argument("--fig10", default="", help="later start steps for FP16(SVD(0.6))+INT8, e.g. 20,40 (Figure 10)")
    p.add_argument("--bleu", action="store_true",
                   help="score each trained run's BLEU on the test split over the switches (as the main job does)")
    p.add_argument("--paper-shape", action="store_true", help="the communication-only table at [128, 64, 768]")
    p.add_argument("--reps", type=int, default=3, help="codec timings per row in --paper-shape")
    args = smallest(p.parse_args(argv))
    if args.warmup >= args.steps:
        p.error(f"--warmup {args.warmup} leaves no timed step of --steps {args.steps}; lower --warmup")
    specs = rows(args.rows)
    if args.paper_shape:
        lines = paper_shape_table(args, specs)
    else:
        specs += [(f"FP16(SVD(0.6))+INT8 from step {s}", "fp16(svd(0.6))", "int8", int(s))
                  for s in args.fig10.split(",") if s]
        lines = training_table(args, specs)
    text = "\n".join(lines)
    print(text)
    out = Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    (out / ("table5_paper_shape.md" if args.paper_shape else "table5.md")).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
