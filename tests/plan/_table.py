"""A small measured table, written with the benchmark's own `write_rows`, whose numbers the tests compute by hand.

The table's model: PARAMS parameters, hidden HIDDEN, STEPS optimizer steps of 8 x 64 = 512 tokens. One cluster
computes 2 s per step; the data-parallel modes split it over two clusters (1 s per step); the pipeline's critical
path is 1.1 s per step (its fill and drain bubble).
"""
from __future__ import annotations

from pathlib import Path

from nebula.quality.rows import RowResult, RowSpec, Traffic, write_rows

STEPS, TOKENS_PER_STEP, HIDDEN, PARAMS = 1000, 512, 128, 1_000_000
TOKENS = STEPS * TOKENS_PER_STEP
BASE_LOSS = 4.0
ACT = TOKENS_PER_STEP * HIDDEN * 4  # float32 activation at the cut per step, one direction


def row(mode: str, loss: float, compute_s: float, traffic: Traffic = Traffic(), *, wan_bytes: int | None = None,
        seed: int = 0, params: int = PARAMS, **spec) -> RowResult:
    """One measured row; its WAN bytes default to both directions of every exchange."""
    if wan_bytes is None:
        wan_bytes = int(2 * traffic.exchanges * traffic.bytes_per_exchange)
    return RowResult(spec=RowSpec(mode, **spec), heldout_loss=loss, wan_bytes=wan_bytes, wall_s=compute_s,
                     compute_s=compute_s, steps=STEPS, tokens=TOKENS, params=params, seed=seed, traffic=traffic)


def rows(params: int = PARAMS) -> list[RowResult]:
    """Every mode: all-reduce and the pipeline lose nothing, DiLoCo 1% and 1.5%, federated 10%."""
    grad = 4 * params  # float32 gradient, one direction
    return [
        row("one-cluster", BASE_LOSS, 2.0 * STEPS, params=params),
        row("one-cluster", BASE_LOSS + 0.02, 2.0 * STEPS, params=params, seed=1),
        row("all-reduce", BASE_LOSS + 0.01, 1.0 * STEPS, Traffic(STEPS, grad, 1.0), params=params),
        row("pipeline", BASE_LOSS + 0.01, 1.1 * STEPS, Traffic(STEPS, ACT, 2.0), params=params),
        row("pipeline", BASE_LOSS + 0.04, 1.1 * STEPS, Traffic(STEPS, ACT / 4, 1.0, overlapped=True),
            params=params, codec="int8", stale_weights=1),
        row("diloco", BASE_LOSS + 0.05, 1.0 * STEPS, Traffic(STEPS // 10, grad, 1.0), params=params,
            sync_every=10),
        row("diloco", BASE_LOSS + 0.07, 1.0 * STEPS, Traffic(STEPS // 100, grad / 4, 1.0), params=params,
            sync_every=100, codec="int8"),
        row("federated", BASE_LOSS + 0.41, 1.0 * STEPS, Traffic(STEPS // 10, 2 * grad, 2.0), params=params,
            sync_every=10),
    ]


def write_table(path: Path, params: int = PARAMS, hidden: int | None = HIDDEN) -> Path:
    """The table as `benchmarks/wan_quality.py --json` writes it (meta with the model's hidden size)."""
    meta = {"size": {"hidden": hidden, "global_batch": 8, "seq_len": 64}, "model": "llama-h128"} if hidden else None
    write_rows(path, rows(params), meta=meta)
    return path
