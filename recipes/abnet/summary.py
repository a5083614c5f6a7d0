"""The operator's view of a two-cluster run: loss-curve PNG, summary table, sample translations.

`python -m recipes.abnet.summary RUN` summarises a local run (both clusters' files on this machine: run_local.sh);
`python -m recipes.abnet.summary RUN --cluster C` one cluster's side on a real cluster, from its own files alone
(the per-cluster launch scripts print it at their end): the same table, less what only the other side holds."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

from nebula.logbook import scalars_note

__all__ = ["summarize", "summarize_side", "raw_boundary_bytes", "main"]


def raw_boundary_bytes(run: Path, steps: int) -> float:
    """Mean uncompressed (float32) bytes of one direction of the boundary per step, from the encoder's own data."""
    from nebula.config.job import load_job_config
    from nebula.pipeline import rank_micro_batches, step_ids

    from recipes.text.catalogs import read_side
    from .trainconfig import load_train_config
    from recipes.text.tokenizer import Tokenizer

    job = load_job_config(run / "job.yaml")
    cfg = load_train_config(run / "train.yaml")
    ids, texts = read_side(run / "A" / "data" / cfg.pair / "train.en.tsv")
    by_id = dict(zip(ids, texts))
    order = sorted(ids)
    tok = Tokenizer(run / "A" / "work" / "base_en" / "spm.model")
    lens = {i: max(1, min(len(tok.encode(by_id[i])), cfg.max_len)) for i in order}
    hidden = json.loads((run / "A" / "work" / "base_en" / "config.json").read_text())["hidden"]
    t, world = job.train, job.cluster("A").world_size
    total = 0
    for s in range(steps):
        all_ids = step_ids(s, seed=t.seed, num_examples=len(order), global_batch=t.global_batch)
        for r in range(world):
            for mb in rank_micro_batches(all_ids, rank=r, world_size=world, micro_batches=t.micro_batches):
                total += len(mb) * max(lens[order[int(i)]] for i in mb) * hidden * 4
    return total / max(steps, 1)


def _records(run: Path, cluster: str) -> list[dict]:
    out = []
    for f in sorted((run / "metrics").glob(f"{cluster}.rank*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def summarize(run: str | Path, samples: int = 8) -> dict:
    """Write <run>/loss.png and <run>/summary.md; return the numbers."""
    from recipes.text.catalogs import read_side
    from .evaluate import plot_losses
    from .trainconfig import load_train_config

    run = Path(run)
    cfg = load_train_config(run / "train.yaml")
    a, b = _records(run, "A"), _records(run, "B")
    if not a or not b:
        raise FileNotFoundError(f"no metrics under {run / 'metrics'}; did both clusters train?")
    b0 = sorted((r for r in b if r["rank"] == 0), key=lambda r: r["step"])
    steps = len(b0)
    losses = [r["loss"] for r in b0]
    wall = b0[-1]["time"] - (b0[0]["time"] - b0[0]["step_s"])
    fwd = sum(r["bytes_sent"] for r in a) / steps
    bwd = sum(r["bytes_sent"] for r in b) / steps
    raw = raw_boundary_bytes(run, steps)
    ev = json.loads((run / "B" / "eval.json").read_text())
    src_ids, src_texts = read_side(run / "A" / "data" / cfg.pair / "test.en.tsv")  # display only: operator's view
    src = dict(zip(src_ids, src_texts))
    plot_losses({"decoder cluster (mean over ranks)": losses}, run / "loss.png",
                title=f"ABNet {cfg.pair}, two clusters")
    job_text = (run / "job.yaml").read_text()
    codec_line = next((ln.strip() for ln in job_text.splitlines() if ln.strip().startswith("compression:")), "")
    out = {
        "bleu_before": ev["bleu_before"], "bleu_after": ev["bleu_after"], "steps": steps,
        "steps_per_s": steps / wall, "wan_bytes_per_step": fwd + bwd, "forward_bytes_per_step": fwd,
        "backward_bytes_per_step": bwd, "forward_ratio": fwd / raw, "backward_ratio": bwd / raw,
        "loss_first": float(np.mean(losses[:20])), "loss_last": float(np.mean(losses[-20:])),
    }
    rows = [
        ("BLEU (test, case-insensitive) untrained -> trained", f"{out['bleu_before']:.2f} -> {out['bleu_after']:.2f}"),
        ("loss, first 20 -> last 20 steps", f"{out['loss_first']:.3f} -> {out['loss_last']:.3f}"),
        ("steps / s", f"{out['steps_per_s']:.2f}"),
        ("WAN bytes per step (A->B + B->A)", f"{out['wan_bytes_per_step']:,.0f}"),
        ("compression ratio forward (activations)", f"{out['forward_ratio']:.3f}"),
        ("compression ratio backward (gradients)", f"{out['backward_ratio']:.3f}"),
        ("codecs", codec_line),
    ]
    lines = ["| quantity | value |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows), ""]
    lines.append("Sample translations (English source from cluster A, shown here only because both run on this machine):")
    lines.append("")
    for h in ev["hypotheses"][:samples]:
        lines += [f"- en:      {src.get(h['id'], '?')}", f"  ref:     {h['ref']}", f"  before:  {h['before']}",
                  f"  after:   {h['after']}"]
    (run / "summary.md").write_text("\n".join(lines) + "\n")
    out["text"] = "\n".join(lines)
    return out


def _side(job, cluster: str) -> str:
    """'encoder' or 'decoder': the stage `cluster` runs."""
    names = {st.name for st in job.stages if st.cluster == cluster}
    if not names & {"encoder", "decoder"}:
        raise ValueError(f"cluster {cluster} runs no ABNet stage (stages: "
                         f"{', '.join(f'{st.name}@{st.cluster}' for st in job.stages)}); give --cluster of the job")
    return "encoder" if "encoder" in names else "decoder"


def summarize_side(run: str | Path, cluster: str, samples: int = 8) -> dict:
    """One cluster's side of the run from the files it has (its metrics, its eval.json): <run>/<cluster>/summary.md,
    <run>/<cluster>/loss.png on the decoder's side (where the loss is); return the numbers."""
    from nebula.config.job import load_job_config
    from nebula.launch.summary import cluster_summary
    from .evaluate import plot_losses

    run = Path(run)
    job = load_job_config(run / "job.yaml")
    side = _side(job, cluster)
    s = cluster_summary(job.metrics.dir, cluster)
    ev_file = run / cluster / "eval.json"
    ev = json.loads(ev_file.read_text()) if ev_file.is_file() else None
    peer = next((st.cluster for st in job.stages if st.cluster != cluster), "the other cluster")
    direction = "forward (activations)" if side == "encoder" else "backward (gradients)"
    codecs = f"forward {job.compression.forward}, backward {job.compression.backward}"
    rows = [
        ("BLEU (test, case-insensitive) untrained -> trained",
         f"{ev['bleu_before']:.2f} -> {ev['bleu_after']:.2f}" if ev else f"on cluster {peer} (the decoder's side)"),
        ("loss, first 20 -> last 20 steps", f"{s.loss_first:.3f} -> {s.loss_last:.3f}" if s.loss_first is not None
         else f"on cluster {peer} (the decoder's side)"),
        ("steps", f"{s.first_step}..{s.last_step} ({s.steps})"),
        ("steps / s", f"{s.steps_per_s:.2f}" if s.steps_per_s else "?"),
        (f"WAN bytes per step ({cluster}->{peer} + {peer}->{cluster})",
         f"{s.bytes_sent_per_step + s.bytes_recv_per_step:,.0f}"),
        (f"compression ratio {direction}", f"{s.sent_ratio:.3f}" if s.sent_ratio is not None else "?"),
        ("codecs", codecs),
    ]
    lines = [f"Cluster {cluster} ({side})", "", "| quantity | value |", "| --- | --- |",
             *(f"| {k} | {v} |" for k, v in rows), ""]
    if ev:
        lines += ["Sample translations (the English source is on the encoder's cluster):", ""]
        for h in ev["hypotheses"][:samples]:
            lines += [f"- ref:     {h['ref']}", f"  before:  {h['before']}", f"  after:   {h['after']}"]
    out_dir = run / cluster
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    out = {"cluster": cluster, "side": side, **asdict(s), "text": "\n".join(lines),
           "bleu_before": ev["bleu_before"] if ev else None, "bleu_after": ev["bleu_after"] if ev else None}
    if s.loss_first is not None:
        from nebula.launch.summary import read_cluster

        recs = sorted((r for r in read_cluster(job.metrics.dir, cluster) if r.get("rank") == 0
                       and r.get("loss") is not None), key=lambda r: r["step"])
        plot_losses({f"cluster {cluster}": [r["loss"] for r in recs]}, out_dir / "loss.png",
                    title=f"ABNet, cluster {cluster} ({side})")
        out["plot"] = str(out_dir / "loss.png")
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m recipes.abnet.summary RUN_DIR [--cluster C]."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("run")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--cluster", default=None,
                   help="summarise this cluster's side from its own files only (on a real cluster)")
    args = p.parse_args(argv)
    from nebula.config import ConfigError

    try:
        if args.cluster:
            side = summarize_side(args.run, args.cluster, args.samples)
            print(side["text"])
            extra = f"; loss curve: {side['plot']}" if "plot" in side else ""
            print(f"table: {Path(args.run) / args.cluster / 'summary.md'}{extra}")
            return 0
        out = summarize(args.run, args.samples)
    except (FileNotFoundError, ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out["text"])
    print(f"loss curve: {Path(args.run) / 'loss.png'}; table: {Path(args.run) / 'summary.md'}")
    print(scalars_note(Path(args.run) / "metrics", Path(args.run) / "vdl"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
