"""Pipeline and DiLoCo runs of the LLM recipe side by side: loss curves (loss.png), WAN bytes per step, steps/s,
compression ratio (summary.md), and VisualDL scalars per mode and cluster (vdl/).

`python -m recipes.llm.summary RUN` reads RUN/pipeline/metrics and RUN/diloco/metrics (either may be missing).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from nebula.logbook import scalars_note
from nebula.pipeline.metrics import read_metrics

__all__ = ["summarize", "main"]


def _rank0(metrics: Path) -> dict[str, list[dict]]:
    return {f.name.split(".")[0]: read_metrics(f) for f in sorted(metrics.glob("*.rank0.jsonl"))}


def _pipeline_row(recs: dict[str, list[dict]]) -> dict:
    """Loss from the last stage's cluster (B), WAN bytes both ways per step, the codec's ratio on what A sent."""
    b = recs["B"]
    sent = sum(r["bytes_sent"] for rs in recs.values() for r in rs)
    raw = sum(r.get("raw_bytes_sent", 0) for rs in recs.values() for r in rs)
    return {"losses": [r["loss"] for r in b], "wan_bytes_per_step": sent / len(b),
            "steps_per_s": len(b) / sum(r["step_s"] for r in b), "compression": raw / sent if sent else None,
            "steps": len(b)}


def _diloco_row(recs: dict[str, list[dict]], model_bytes: float | None) -> dict:
    """Mean loss of the clusters' replicas, WAN bytes (every cluster's pseudo-gradients) per step."""
    n = min(len(rs) for rs in recs.values())
    losses = [float(np.mean([rs[s]["loss"] for rs in recs.values()])) for s in range(n)]
    sent = sum(r["bytes_sent"] for rs in recs.values() for r in rs[:n])
    syncs = sum(1 for rs in recs.values() for r in rs[:n] if r.get("synced"))
    compression = model_bytes * syncs / sent if model_bytes and sent else None
    return {"losses": losses, "wan_bytes_per_step": sent / n, "steps": n, "compression": compression,
            "steps_per_s": n / max(sum(r["step_s"] for r in recs["A"][:n]), 1e-9)}


def _model_bytes(run: Path) -> float | None:
    """float32 bytes of the model's parameters (what a DiLoCo sync sends per cluster before its codec)."""
    import paddle

    files = sorted((run / "diloco" / "ckpt").glob("*/step_*/*/model.pdparams"))
    if not files:
        return None
    newest = max(files, key=lambda f: f.parent.parent.name)
    return float(sum(v.size * 4 for v in paddle.load(str(newest)).values()))


def summarize(run: str | Path) -> dict:
    """Write RUN/loss.png, RUN/summary.md and RUN/vdl; return the numbers and the text."""
    run = Path(run)
    rows = {}
    if (run / "pipeline" / "metrics").is_dir():
        rows["pipeline"] = _pipeline_row(_rank0(run / "pipeline" / "metrics"))
    model_bytes = None
    if (run / "diloco" / "metrics").is_dir():
        model_bytes = _model_bytes(run)
        rows["diloco"] = _diloco_row(_rank0(run / "diloco" / "metrics"), model_bytes)
    if not rows:
        raise FileNotFoundError(f"no metrics under {run}/pipeline or {run}/diloco; did the clusters train?")
    _plot(rows, run / "loss.png")
    head = ["| mode | steps | loss, first 10 -> last 10 steps | WAN bytes / step | compression | steps / s |",
            "| --- | ---: | --- | ---: | ---: | ---: |"]
    for mode, r in rows.items():
        ls = r["losses"]
        comp = "-" if r["compression"] is None else f"{r['compression']:.2f}x"
        head.append(f"| {mode} | {r['steps']} | {np.mean(ls[:10]):.3f} -> {np.mean(ls[-10:]):.3f} | "
                    f"{r['wan_bytes_per_step']:,.0f} | {comp} | {r['steps_per_s']:.2f} |")
    head += ["", *_curve(rows)]
    text = "\n".join(head)
    (run / "summary.md").write_text(text + "\n")
    notes = [scalars_note(run / "pipeline" / "metrics", run / "vdl" / "pipeline")] if "pipeline" in rows else []
    if "diloco" in rows:
        notes.append(scalars_note(run / "diloco" / "metrics", run / "vdl" / "diloco",
                                  raw_bytes=lambda r: model_bytes if r.get("synced") else None))
    return {"rows": rows, "text": text, "notes": notes}


def _curve(rows: dict, windows: int = 8) -> list[str]:
    """The loss curves as a table: mean loss over consecutive windows of steps, one column per mode."""
    n = min(len(r["losses"]) for r in rows.values())
    edges = np.linspace(0, n, min(windows, n) + 1).astype(int)
    out = ["| steps | " + " | ".join(f"{m} loss" for m in rows) + " |", "| --- |" + " ---: |" * len(rows)]
    for a, b in zip(edges, edges[1:]):
        out.append(f"| {a}-{b - 1} | " + " | ".join(f"{np.mean(r['losses'][a:b]):.3f}" for r in rows.values()) + " |")
    return out


def _plot(rows: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    labels = {"pipeline": "pipeline (layers cut between A and B)", "diloco": "DiLoCo (mean of A and B replicas)"}
    for mode, r in rows.items():
        ax.plot(range(len(r["losses"])), r["losses"], label=f"{labels[mode]}, {r['wan_bytes_per_step']:,.0f} "
                                                             "WAN B/step")
    ax.set_xlabel("step")
    ax.set_ylabel("causal-LM loss (nats/token)")
    ax.set_title("tiny Llama on gettext messages, two clusters")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m recipes.llm.summary RUN."""
    p = argparse.ArgumentParser(prog="python -m recipes.llm.summary", description=__doc__)
    p.add_argument("run")
    args = p.parse_args(argv)
    try:
        out = summarize(args.run)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out["text"])
    print(f"loss curves: {Path(args.run) / 'loss.png'}; table: {Path(args.run) / 'summary.md'}")
    for line in out["notes"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
