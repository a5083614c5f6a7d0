"""Per-step metrics as VisualDL scalars: loss, steps/s, WAN bytes and compression ratio, one run per cluster.

The runtime's metrics files (`<dir>/<cluster>.rank<r>.jsonl`, nebula.pipeline.metrics) are the source; rank 0 of
each cluster speaks for it. `scalars_of` turns records into `Scalar`s (pure); `write_scalars` writes each
cluster's series with VisualDL's own `LogWriter` into `<logdir>/<cluster>/`, so `visualdl --logdir LOGDIR` draws
the clusters side by side; `read_scalars` reads them back with VisualDL's `LogReader`. VisualDL is an optional
extra (`pip install -e '.[visualdl]'`): without it `write_scalars` raises `LogbookUnavailable` saying so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["Scalar", "LogbookUnavailable", "TAGS", "scalars_of", "write_scalars", "read_scalars", "log_metrics_dir",
           "scalars_note", "VISUALDL_INSTALL"]

VISUALDL_INSTALL = "pip install -e '.[visualdl]'"
TAGS = ("loss", "steps_per_s", "wan_bytes", "compression_ratio")
_RANK0 = re.compile(r"^(?P<cluster>[\w-]+)\.rank0\.jsonl$")


class LogbookUnavailable(ImportError):
    """VisualDL is not installed; the message gives the install command."""


@dataclass(frozen=True, slots=True)
class Scalar:
    """One point of one series."""

    tag: str
    step: int
    value: float


def scalars_of(records: Iterable[Mapping[str, Any]],
               raw_bytes: Callable[[Mapping[str, Any]], float | None] | None = None) -> list[Scalar]:
    """The scalars of one cluster's per-step records: `loss` (where there is one), `steps_per_s` (1 / step_s),
    `wan_bytes` (sent + received that step) and `compression_ratio` (bytes before the codec over bytes sent, from
    the record's `raw_bytes_sent` or, where a mode does not record it, from `raw_bytes(record)`)."""
    out: list[Scalar] = []
    for r in records:
        step = int(r["step"])
        if r.get("loss") is not None:
            out.append(Scalar("loss", step, float(r["loss"])))
        if r.get("step_s"):
            out.append(Scalar("steps_per_s", step, 1.0 / float(r["step_s"])))
        sent = int(r.get("bytes_sent") or 0)
        out.append(Scalar("wan_bytes", step, float(sent + int(r.get("bytes_recv") or 0))))
        raw = r.get("raw_bytes_sent") or (raw_bytes(r) if raw_bytes is not None else None)
        if raw and sent:
            out.append(Scalar("compression_ratio", step, float(raw) / sent))
    return out


def _log_writer() -> Any:
    try:
        from visualdl import LogWriter
    except ImportError as exc:
        raise LogbookUnavailable(f"VisualDL is not installed ({exc}); install it with {VISUALDL_INSTALL}") from None
    return LogWriter


def write_scalars(logdir: str | Path, series: Mapping[str, Sequence[Scalar]]) -> dict[str, Path]:
    """Write each run's scalars (run name -> scalars, e.g. one per cluster) under `<logdir>/<run>/`; the run dirs."""
    log_writer = _log_writer()
    out = {}
    for run, scalars in series.items():
        d = Path(logdir) / run
        d.mkdir(parents=True, exist_ok=True)
        with log_writer(logdir=str(d)) as w:
            for s in scalars:
                w.add_scalar(tag=s.tag, value=s.value, step=s.step)
        out[run] = d
    return out


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of one run directory, read with VisualDL's LogReader: tag -> [(step, value)]."""
    try:
        from visualdl import LogReader
    except ImportError as exc:
        raise LogbookUnavailable(f"VisualDL is not installed ({exc}); install it with {VISUALDL_INSTALL}") from None
    files = sorted(Path(run_dir).glob("vdlrecords.*.log"))
    if not files:
        raise FileNotFoundError(f"{run_dir} holds no VisualDL log (vdlrecords.*.log)")
    out: dict[str, list[tuple[int, float]]] = {}
    for f in files:
        reader = LogReader(file_path=str(f))
        for tag in reader.get_tags().get("scalar", []):
            out.setdefault(tag, []).extend((int(r.id), float(r.value)) for r in reader.get_data("scalar", tag))
    return {t: sorted(v) for t, v in out.items()}


def log_metrics_dir(metrics_dir: str | Path, logdir: str | Path, *,
                    raw_bytes: Callable[[Mapping[str, Any]], float | None] | None = None,
                    names: Mapping[str, str] | None = None) -> dict[str, Path]:
    """VisualDL scalars of every cluster whose rank-0 metrics file is in `metrics_dir` (run named by `names` or by
    the cluster); the run dirs. Nothing to write (no metrics file) gives {}."""
    from nebula.pipeline.metrics import read_metrics

    series = {}
    for f in sorted(Path(metrics_dir).glob("*.rank0.jsonl")):
        m = _RANK0.match(f.name)
        if m:
            cluster = m["cluster"]
            series[(names or {}).get(cluster, cluster)] = scalars_of(read_metrics(f), raw_bytes)
    return write_scalars(logdir, series) if series else {}


def scalars_note(metrics_dir: str | Path, logdir: str | Path, **kw: Any) -> str:
    """`log_metrics_dir`, then one line for a recipe to print: where the scalars are, or why none were written."""
    try:
        runs = log_metrics_dir(metrics_dir, logdir, **kw)
    except LogbookUnavailable as exc:
        return f"VisualDL scalars not written: {exc}"
    if not runs:
        return f"VisualDL scalars not written: no <cluster>.rank0.jsonl under {metrics_dir}"
    return f"VisualDL scalars of {', '.join(runs)}: {logdir} (visualdl --logdir {logdir})"
