"""The rows of the quality-per-WAN-byte benchmark: what a row runs (`RowSpec`) and what it measured (`RowResult`).

A row is one way of training the same model on the same tokens across two clusters: `one-cluster` (the baseline,
no WAN), `all-reduce` (gradients averaged over the WAN every step), `pipeline` (the model cut in two, activations
forward and gradients back over the WAN, optionally with N-step-stale weights upstream), `diloco` (a replica per
cluster, DiLoCo's outer step every `sync_every` inner steps on pseudo-gradients sent through `codec`) and
`streaming-diloco` (DiLoCo with the model in `fragments` synced in turn, each every `sync_every` steps, its
outer update merged `delay` inner steps after its send began, so the send overlaps compute) and `federated` (FedAvg
over each cluster's clients every `sync_every` local steps). Results serialise to the JSON rows
`benchmarks/wan_quality.py --json` writes and `nebula plan` reads.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

__all__ = ["MODES", "RowSpec", "RowResult", "Traffic", "write_rows", "read_rows", "data_fingerprint",
           "check_same_data"]

MODES = ("one-cluster", "all-reduce", "pipeline", "diloco", "streaming-diloco", "federated")


@dataclass(frozen=True)
class Traffic:
    """What crosses the WAN in one run, for the link model (`nebula.plan.link`, whose docstring says what each mode
    records).

    `exchanges`: blocking exchanges over the whole run; `bytes_per_exchange`: the bytes on the critical path of one
    (crossing one after another; two clusters sending to each other at once count once: the link is full duplex);
    `link_bytes_per_exchange`: what the busier direction carries in one (0: the same as bytes_per_exchange);
    `latencies_per_exchange`: the one-way latencies one waits; `overlapped`: the exchanges run behind compute
    (stale weights) rather than between steps.
    """

    exchanges: int = 0
    bytes_per_exchange: float = 0.0
    latencies_per_exchange: float = 1.0
    overlapped: bool = False
    link_bytes_per_exchange: float = 0.0

    @property
    def link_bytes(self) -> float:
        """Bytes the busier direction carries per exchange."""
        return self.link_bytes_per_exchange or self.bytes_per_exchange

    def __post_init__(self) -> None:
        if min(self.exchanges, self.bytes_per_exchange, self.latencies_per_exchange,
               self.link_bytes_per_exchange) < 0:
            raise ValueError(f"traffic fields must be >= 0, got {self}")


@dataclass(frozen=True)
class RowSpec:
    """One benchmark row: the mode and its WAN settings."""

    mode: str
    codec: str = "none"
    sync_every: int = 1
    stale_weights: int = 0
    grad_codec: str = ""  # pipeline: the codec of gradients going back ("" = same as codec)
    fragments: int = 1  # streaming-diloco: slices of the model synced in turn
    delay: int = 0  # streaming-diloco: inner steps between a fragment's send and its merge (0: at once)
    epochs: int = 0  # > 0: train on steps x global_batch / epochs examples, each seen `epochs` times (0: the corpus)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"row mode {self.mode!r} is not one of {', '.join(MODES)}")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 0:
            raise ValueError(f"row {self.mode}: epochs={self.epochs!r} must be an integer >= 0 (0: the whole corpus)")
        if self.sync_every < 1:
            raise ValueError(f"row {self.mode}: sync_every={self.sync_every} must be >= 1")
        if self.mode == "streaming-diloco":  # the job file's own rules for the same settings
            from nebula.config.job_sections import DataParallelSpec, OuterSpec, StreamingSpec

            try:
                DataParallelSpec(sync_every=self.sync_every, outer=OuterSpec(algorithm="diloco"),
                                 streaming=StreamingSpec(fragments=self.fragments, delay=self.delay))
            except ValueError as exc:
                raise ValueError(f"row {self.mode}: {exc}") from None
        elif self.fragments != 1 or self.delay:
            raise ValueError(f"row {self.mode}: fragments and delay apply to mode streaming-diloco only")
        if self.mode != "pipeline" and (self.grad_codec or "delta(" in self.codec):
            raise ValueError(f"row {self.mode}: grad_codec and delta codecs apply to mode pipeline only")
        if "delta(" in self.codec and not self.grad_codec:
            raise ValueError(f"row {self.mode}: codec {self.codec!r} sends activations only; set grad_codec (e.g. "
                             "fp4) for the gradients")
        if "delta(" in self.grad_codec:
            raise ValueError(f"row {self.mode}: grad_codec={self.grad_codec!r}: gradients carry no example ids; "
                             "use delta for the activations (codec) and a codec without delta for the gradients")
        if self.stale_weights and self.mode != "pipeline":
            raise ValueError(f"row {self.mode}: stale_weights applies to mode pipeline only")

    @property
    def name(self) -> str:
        """A short label: mode, codec, interval, staleness."""
        parts = [self.mode]
        if self.mode in ("diloco", "streaming-diloco", "federated"):
            parts.append(f"H={self.sync_every}")
        if self.mode == "streaming-diloco":
            parts.append(f"F={self.fragments} tau={self.delay}")
        if self.mode != "one-cluster":
            parts.append(self.codec)
        if self.grad_codec and self.grad_codec != self.codec:
            parts.append(f"grad {self.grad_codec}")
        if self.stale_weights:
            parts.append(f"stale {self.stale_weights}")
        if self.epochs:
            parts.append(f"{self.epochs} epochs")
        return " ".join(parts)


@dataclass(frozen=True)
class RowResult:
    """What one row measured. Losses are mean next-token cross-entropy in nats on the held-out split."""

    spec: RowSpec
    heldout_loss: float
    wan_bytes: int
    wall_s: float
    compute_s: float
    steps: int
    tokens: int
    params: int
    seed: int
    peak_wan_bytes: int = 0
    traffic: Traffic = field(default_factory=Traffic)
    train_loss: float = float("nan")
    extra: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # the run's settings (size, lr, outer step) it was measured at

    @property
    def perplexity(self) -> float:
        """exp(held-out loss)."""
        return math.exp(self.heldout_loss) if self.heldout_loss < 700 else float("inf")

    def to_json(self) -> dict[str, Any]:
        """A flat row: mode, codec, sync_every, stale_weights, heldout_loss, perplexity, wan_bytes, wall_s, ..."""
        d = dataclasses.asdict(self.spec)
        d.update({k: v for k, v in dataclasses.asdict(self).items() if k not in ("spec", "traffic")})
        d["traffic"] = dataclasses.asdict(self.traffic)
        d["perplexity"] = self.perplexity
        d["name"] = self.spec.name
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RowResult":
        """The inverse of to_json (ValueError naming a missing key)."""
        spec_keys = {f.name for f in dataclasses.fields(RowSpec)}
        try:
            spec = RowSpec(**{k: d[k] for k in spec_keys if k in d})
            fields = {f.name for f in dataclasses.fields(cls)} - {"spec", "traffic"}
            kw = {k: d[k] for k in fields if k in d}
            return cls(spec=spec, traffic=Traffic(**d.get("traffic", {})), **kw)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"benchmark row {d.get('name', d.get('mode'))!r}: {exc}; write it with "
                             "benchmarks/wan_quality.py --json") from None


def write_rows(path: str | Path, rows: Iterable[RowResult], meta: dict[str, Any] | None = None) -> None:
    """Write rows as a JSON list (one object per row). `meta`, the settings of this run, goes into the `meta` key
    of each row measured by it; a row read from an earlier file keeps the meta it was measured with."""
    out = []
    for r in rows:
        d = r.to_json()
        if meta and not r.meta:
            d["meta"] = meta
        out.append(d)
    Path(path).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


def read_rows(path: str | Path) -> list[RowResult]:
    """Rows written by `write_rows` (ValueError naming the file on bad content)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p}: cannot read benchmark rows ({exc}); write them with benchmarks/wan_quality.py "
                         "--json FILE") from None
    if not isinstance(doc, list):
        raise ValueError(f"{p}: benchmark rows must be a JSON list, got {type(doc).__name__}")
    return [RowResult.from_json(d) for d in doc]


def data_fingerprint(model_dir: str | Path, *texts: str | Path) -> str:
    """What a row's loss depends on besides its settings: the model's initial weights, config and tokenizer and the
    train and held-out texts, as 16 hex digits of their SHA-256 (the corpus is built from the machine's installed
    packages, so two machines, or one after an install, can build different ones)."""
    h = hashlib.sha256()
    d = Path(model_dir)
    for f in [*sorted(p for p in d.iterdir() if p.suffix in (".json", ".safetensors")), *map(Path, texts)]:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def check_same_data(rows: Iterable[RowResult], data: str | None = None) -> list[str]:
    """Refuse rows measured on different data (ValueError naming two of them and the fix); the names of the rows
    that carry no fingerprint (measured before it was kept), which nothing can check."""
    seen: dict[str, str] = {data: "this run"} if data else {}
    unknown = []
    for r in rows:
        fp = r.meta.get("data")
        if not fp:
            unknown.append(r.spec.name)
        elif seen and fp not in seen:
            other = next(iter(seen.items()))
            raise ValueError(f"row {r.spec.name!r} was measured on data {fp} and {other[1]!r} on {other[0]} (the "
                             "corpus or the model was built again); compare rows of one corpus and model: run the "
                             "rows again into a new file")
        else:
            seen.setdefault(fp, r.spec.name)
    return unknown
