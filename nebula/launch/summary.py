"""One cluster's view of a finished run, from its own metrics files alone (what a site has): steps, loss, steps/s,
WAN bytes each way per step and the codec's ratio on what it sent. `nebula launch` prints it when the cluster's
ranks finish; `python -m nebula.launch.summary METRICS_DIR CLUSTER` prints it again.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

__all__ = ["ClusterSummary", "summarize_records", "read_cluster", "cluster_summary", "main"]

WINDOW = 20  # loss is shown as the mean of the first and of the last this many steps (one step is noisy)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


@dataclass(frozen=True)
class ClusterSummary:
    """The numbers of one cluster's run (`asdict` gives them as JSON) and `line()`, the text `nebula launch`
    prints."""

    cluster: str
    steps: int
    first_step: int
    last_step: int
    loss_first: float | None  # mean of the first WINDOW steps' losses (None: this cluster computes no loss)
    loss_last: float | None
    steps_per_s: float | None
    bytes_sent_per_step: float  # every rank's boundary bytes, both ways
    bytes_recv_per_step: float
    sent_ratio: float | None  # bytes sent / their uncompressed size (None: nothing sent)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.last_step < self.first_step:
            raise ValueError(f"cluster {self.cluster}: steps={self.steps} from {self.first_step} to "
                             f"{self.last_step} is no run")

    def line(self) -> str:
        """`cluster B: steps 0..99 (100), loss 5.1 -> 2.3 (...), 6.4 steps/s, WAN bytes per step: ...`."""
        parts = [f"cluster {self.cluster}: steps {self.first_step}..{self.last_step} ({self.steps})"]
        if self.loss_first is not None and self.loss_last is not None:
            parts.append(f"loss {self.loss_first:.4g} -> {self.loss_last:.4g} (mean of first / last "
                         f"{min(WINDOW, self.steps)} steps)")
        if self.steps_per_s is not None:
            parts.append(f"{self.steps_per_s:.3g} steps/s")
        if not self.bytes_sent_per_step and not self.bytes_recv_per_step:
            return ", ".join(parts + ["no WAN traffic"])
        wan = (f"WAN bytes per step: {self.bytes_sent_per_step:,.0f} sent, {self.bytes_recv_per_step:,.0f} "
               "received")
        if self.sent_ratio is not None:
            wan += f" (sent at {self.sent_ratio:.3f} of its uncompressed size)"
        parts.append(wan)
        return ", ".join(parts)


def summarize_records(cluster: str, records: Sequence[dict[str, Any]]) -> ClusterSummary:
    """The summary of `cluster`'s metrics records (every rank's). A step recorded twice (a launch that resumed
    from a checkpoint ran it again) counts once: its newest record."""
    latest: dict[tuple[int, int], dict] = {}
    for r in records:
        if isinstance(r, dict) and isinstance(r.get("step"), int):  # (a record of another kind: not a step)
            latest[(int(r.get("rank", 0)), r["step"])] = r
    if not latest:
        raise ValueError(f"cluster {cluster} has no metrics records: did it train?")
    rank0 = sorted((r for (rank, _), r in latest.items() if rank == 0), key=lambda r: r["step"])
    rank0 = rank0 or sorted(latest.values(), key=lambda r: r["step"])
    steps = len(rank0)
    losses = [float(r["loss"]) for r in rank0 if r.get("loss") is not None]
    sent = sum(r.get("bytes_sent", 0) for r in latest.values())
    raw = sum(r.get("raw_bytes_sent", 0) for r in latest.values())
    busy = sum(float(r.get("step_s", 0.0)) for r in rank0)
    return ClusterSummary(
        cluster=cluster, steps=steps, first_step=rank0[0]["step"], last_step=rank0[-1]["step"],
        loss_first=_mean(losses[:WINDOW]), loss_last=_mean(losses[-WINDOW:]),
        steps_per_s=steps / busy if busy > 0 else None,
        bytes_sent_per_step=sent / steps, bytes_recv_per_step=sum(r.get("bytes_recv", 0) for r in latest.values())
        / steps, sent_ratio=sent / raw if raw else None)


def read_cluster(metrics_dir: str | Path, cluster: str) -> list[dict]:
    """Every record of `cluster`'s metrics files (`<cluster>.rank<N>.jsonl`); a torn last line is skipped."""
    out = []
    for f in sorted(Path(metrics_dir).glob(f"{cluster}.rank*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # (a rank killed mid-write)
                continue
    return out


def cluster_summary(metrics_dir: str | Path, cluster: str) -> ClusterSummary:
    """The summary of `cluster`'s run from the metrics files under `metrics_dir`."""
    return summarize_records(cluster, read_cluster(metrics_dir, cluster))


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m nebula.launch.summary METRICS_DIR CLUSTER [--json]."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("metrics_dir", help="the job's metrics.dir (where <cluster>.rank<N>.jsonl are)")
    p.add_argument("cluster", help="the cluster id")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = p.parse_args(argv)
    try:
        s = cluster_summary(args.metrics_dir, args.cluster)
    except ValueError as exc:
        print(f"error: {exc} (no {args.cluster}.rank*.jsonl under {args.metrics_dir}: give the job's metrics.dir)",
              file=sys.stderr)
        return 2
    print(json.dumps(asdict(s)) if args.json else s.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
