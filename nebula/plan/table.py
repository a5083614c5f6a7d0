"""`nebula plan`'s table: every mode the benchmark measured, predicted for one job on one link, and the pick.

The benchmark (`benchmarks/wan_quality.py --json`) measured, for one small model, each mode's held-out loss, its
critical-path compute, and its WAN traffic (`RowResult`). For a job and a link, each row becomes

- step compute: the row's measured compute per token x the job's tokens per step x job parameters / table
  parameters (compute per token grows with the parameters); or, with the user's own measured step compute S of
  the job in one cluster, S x the row's compute per token / the one-cluster row's (the mode's parallelism, as
  measured);
- WAN bytes per exchange: the row's, scaled by job / table parameters for the modes that send the model
  (all-reduce, diloco, federated) and by the activation at the cut (global batch x seq_len x hidden) for the
  pipeline, so each codec keeps the bytes ratio it measured;
- step time: `predicted_wall_s` over the row's steps, divided by them;
- quality cost: the row's held-out loss relative to the one-cluster baseline's, as measured on the table's model
  (mean over the seeds a spec was run with) -- measured, not predicted for the job. A row of a smaller training set
  seen `epochs` times (activation deltas, `delta(...)`) is measured against the uncompressed pipeline on the same
  data, and its bytes hold for a job that sees its examples as often (deltas pay only on examples seen again).

The recommendation is the fastest predicted step among rows whose quality cost is within the tolerance (the
one-cluster baseline always is: on a link too slow for every mode, the answer is not to cross it); rows within 1%
of that step time are ties, broken by the lower quality cost, then the fewer WAN bytes.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nebula.plan.link import WanLink, predicted_wall_s
from nebula.plan.sizing import JobSize
from nebula.quality.rows import RowResult, RowSpec, read_rows

__all__ = ["Table", "PlanRow", "Plan", "load_table", "make_plan", "format_plan", "table_hidden", "TIE"]

TIE = 0.01  # step times within this fraction of the fastest are ties
_DATA_PARALLEL = ("all-reduce", "diloco", "streaming-diloco", "federated")


@dataclass(frozen=True)
class Table:
    """The benchmark's measured rows (one per spec, held-out loss averaged over seeds) and what it measured on."""

    path: Path
    rows: tuple[RowResult, ...]
    seeds: dict[RowSpec, int]  # runs averaged into each row
    baseline: RowResult
    baseline_spread: float | None  # (max - min) / mean of the baseline's held-out loss over seeds; None: one seed
    hidden: int | None  # the table model's hidden size, where the rows' meta says it

    @property
    def params(self) -> int:
        """Parameters of the table's model."""
        return self.baseline.params

    @property
    def tokens_per_step(self) -> float:
        """The baseline's tokens per optimizer step."""
        return self.baseline.tokens / self.baseline.steps


def _meta_hidden(meta: Any) -> int | None:
    if not isinstance(meta, dict):
        return None
    for d in (meta, meta.get("size"), meta.get("model")):  # benchmarks/wan_quality.py: meta["size"]["hidden"]
        if isinstance(d, dict):
            for k in ("hidden_size", "hidden"):
                if isinstance(d.get(k), int) and not isinstance(d.get(k), bool) and d[k] > 0:
                    return d[k]
    return None


def load_table(path: str | Path) -> Table:
    """The rows of a benchmark JSON file; ValueError (one line naming the file and the fix) when it cannot serve."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"no benchmark table at {p}; measure one with `python benchmarks/wan_quality.py --json "
                         f"{p}` or pass --table ROWS.json")
    results = read_rows(p)
    doc = json.loads(p.read_text(encoding="utf-8"))
    hidden = next((h for h in (_meta_hidden(d.get("meta")) for d in doc if isinstance(d, dict)) if h), None)
    groups: dict[RowSpec, list[RowResult]] = {}
    for r in results:
        if r.steps < 1 or r.tokens < 1 or r.params < 1 or not r.compute_s > 0:
            raise ValueError(f"{p}: row {r.spec.name!r} has steps={r.steps}, tokens={r.tokens}, params={r.params}, "
                             f"compute_s={r.compute_s}; every row needs them > 0 (rewrite the table with "
                             "benchmarks/wan_quality.py --json)")
        groups.setdefault(r.spec, []).append(r)
    rows, seeds = [], {}
    for spec, runs in groups.items():
        runs.sort(key=lambda r: r.seed)
        loss = statistics.fmean(r.heldout_loss for r in runs)
        rows.append(replace(runs[0], heldout_loss=loss))
        seeds[spec] = len(runs)
    base = next((r for r in rows if r.spec.mode == "one-cluster"), None)
    if base is None:
        raise ValueError(f"{p} has no one-cluster row, the baseline every quality cost is relative to; rewrite it "
                         "with benchmarks/wan_quality.py --json (it always runs one)")
    if not math.isfinite(base.heldout_loss) or base.heldout_loss <= 0:
        raise ValueError(f"{p}: the one-cluster baseline's held-out loss is {base.heldout_loss}; the quality costs "
                         "need a finite baseline: rerun benchmarks/wan_quality.py --json")
    spread = None
    runs = groups[base.spec]
    if len(runs) > 1:
        losses = [r.heldout_loss for r in runs]
        spread = (max(losses) - min(losses)) / base.heldout_loss
    return Table(p, tuple(rows), seeds, base, spread, hidden)


@dataclass(frozen=True)
class PlanRow:
    """One mode predicted for the job on the link."""

    name: str
    mode: str
    step_s: float  # predicted wall seconds per optimizer step
    compute_s: float  # of which compute (critical path)
    wan_bytes: float  # WAN bytes per step, both directions
    quality_cost: float  # held-out loss / baseline's - 1, measured on the table's model
    heldout_loss: float


@dataclass(frozen=True)
class Plan:
    """The plan: every row, the pick, the rows tied with it, and how the job was scaled from the table."""

    link: WanLink
    rows: tuple[PlanRow, ...]
    tolerance: float
    recommended: PlanRow
    ties: tuple[PlanRow, ...]
    param_scale: float  # job / table parameters
    activation_scale: float | None  # job / table activation at the cut per step; None: hidden size not scaled
    tokens_per_step: float  # the job's


def table_hidden(table: Table) -> tuple[float | None, str]:
    """The table model's hidden size, and where it came from: the rows' meta, else the pipeline row without codec
    (float32 activations forward and float32 gradients back: 8 bytes per value at the cut); None when neither."""
    if table.hidden:
        return float(table.hidden), "the table's meta"
    none = next((r for r in table.rows if r.spec.mode == "pipeline" and r.spec.codec == "none"
                 and r.spec.grad_codec in ("", "none") and not r.spec.epochs), None)
    if none is None:
        return None, ""
    return none.wan_bytes / none.tokens / 8, "the pipeline none row's bytes per token / 8"


def _reference(table: Table, r: RowResult) -> RowResult:
    """The row `r`'s quality is measured against: the one-cluster baseline; for a row trained on a smaller set
    seen several times (`epochs`: activation deltas), the uncompressed pipeline on that same data (which computes
    what one cluster does), where the table has it."""
    if not r.spec.epochs:
        return table.baseline
    twin = replace(r.spec, codec="none", grad_codec="")
    return next((t for t in table.rows if t.spec == twin), table.baseline)


def make_plan(table: Table, link: WanLink, size: JobSize | None, *, tolerance: float = 0.02,
              compute_s: float | None = None) -> Plan:
    """Predict every row of `table` for a job of `size` (None: the table's own model and batch) on `link`."""
    if tolerance < 0:
        raise ValueError(f"quality tolerance {tolerance} must be >= 0 (0.02 = 2% above the baseline's loss)")
    if compute_s is not None and not compute_s > 0:
        raise ValueError(f"--compute-s {compute_s} must be > 0 seconds")
    base = table.baseline
    tokens = size.tokens_per_step if size else table.tokens_per_step
    p_scale = size.params / table.params if size else 1.0
    hidden, _ = table_hidden(table)
    # the job's activation width over the table's (1 when the table's hidden is unknown: tokens alone scale)
    width = size.hidden / hidden if size and hidden else 1.0
    a_scale = width * tokens / table.tokens_per_step if (hidden or not size) else None
    base_per_token = base.compute_s / base.tokens
    out = []
    for r in table.rows:
        per_token = r.compute_s / r.tokens
        if compute_s is not None:
            step_compute = compute_s * per_token / base_per_token
        else:
            step_compute = per_token * tokens * (size.params / r.params if size else 1.0)
        row_tokens = r.tokens / r.steps
        if r.spec.mode in _DATA_PARALLEL:
            scale = size.params / r.params if size else 1.0
        elif r.spec.mode == "pipeline":
            # the activation at the cut per step: the job's tokens x hidden over the row's
            scale = width * tokens / row_tokens
        else:
            scale = 0.0
        traffic = replace(r.traffic, bytes_per_exchange=r.traffic.bytes_per_exchange * scale,
                          link_bytes_per_exchange=r.traffic.link_bytes_per_exchange * scale)
        step = predicted_wall_s(step_compute * r.steps, traffic, link) / r.steps
        out.append(PlanRow(r.spec.name, r.spec.mode, step, step_compute, r.wan_bytes / r.steps * scale,
                           r.heldout_loss / _reference(table, r).heldout_loss - 1.0, r.heldout_loss))
    # the baseline's cost is 0, so at least one row qualifies; a diverged row (NaN loss) never does
    ok = [r for r in out if r.quality_cost <= tolerance + 1e-12]
    fastest = min(r.step_s for r in ok)
    near = sorted((r for r in ok if r.step_s <= fastest * (1 + TIE)), key=lambda r: (r.quality_cost, r.wan_bytes))
    return Plan(link, tuple(out), tolerance, near[0], tuple(near[1:]), p_scale, a_scale, tokens)


def _num(n: float) -> str:
    """1234567 -> '1.23M'."""
    for unit, k in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= k:
            return f"{n / k:.3g}{unit}"
    return f"{n:.3g}"


def _bytes(n: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{n:.0f} B"


def _secs(s: float) -> str:
    return f"{s:.3g}"


def format_plan(plan: Plan, table: Table, size: JobSize | None, *, job: str, recipe: str,
                compute_s: float | None = None) -> str:
    """The table, its footer (what was measured, what scaled) and the recommendation line, as printed."""
    lines = [f"nebula plan: {job} on a {plan.link} link"]
    if size:
        lines.append(f"job model: {_num(size.params)} parameters, hidden {size.hidden}, {size.global_batch} x "
                     f"{size.seq_len} = {size.tokens_per_step} tokens per step (read from {size.source})")
    else:
        lines.append(f"job model: nebula plan cannot size recipe {recipe} (it sizes nebula.formers:CausalLMRecipe);"
                     f" predicting with the table's own model, {_num(table.params)} parameters and "
                     f"{plan.tokens_per_step:.0f} tokens per step")
    width = max(len("mode"), *(len(r.name) for r in plan.rows))
    head = (f"  {'mode':<{width}}  {'step s':>8}  {'compute s':>9}  {'WAN s':>8}  {'WAN bytes/step':>14}  "
            f"{'quality cost':>12}")
    lines += [head, "  " + "-" * (len(head) - 2)]
    for r in sorted(plan.rows, key=lambda r: r.step_s):
        mark = "*" if r is plan.recommended else " "
        lines.append(f"{mark} {r.name:<{width}}  {_secs(r.step_s):>8}  {_secs(r.compute_s):>9}  "
                     f"{_secs(max(r.step_s - r.compute_s, 0.0)):>8}  {_bytes(r.wan_bytes):>14}  "
                     f"{r.quality_cost * 100:>+11.2f}%")
    base = table.baseline
    noise = (f"; its {table.seeds[base.spec]} seeds differ by {table.baseline_spread * 100:.2f}%"
             if table.baseline_spread is not None else "; one seed, so the noise between seeds is not known")
    lines.append(f"quality cost: held-out loss relative to the one-cluster baseline ({base.heldout_loss:.4f} nats"
                 f"{noise}), as measured by benchmarks/wan_quality.py in {table.path} on its {_num(table.params)}"
                 f"-parameter model over {_num(base.tokens)} tokens per row -- measured there, not predicted for "
                 "this job")
    if any(r.spec.epochs for r in table.rows):
        lines.append("rows of N epochs (activation deltas): trained on a smaller set seen N times, their quality cost "
                     "against the uncompressed pipeline on that data and their bytes for a job that sees its examples "
                     "as often")
    if compute_s is not None:
        lines.append(f"step compute: --compute-s {compute_s:g} s (the job in one cluster) x each mode's measured "
                     "compute per token relative to one-cluster's")
    elif not size:
        lines.append(f"step compute: the table's measured compute per token x {plan.tokens_per_step:.0f} tokens per "
                     "step (the table's own model)")
    else:
        lines.append(f"step compute: the table's measured compute per token x job/table parameters "
                     f"(x{plan.param_scale:.3g}) x {plan.tokens_per_step:.0f} tokens per step (compute per token "
                     "taken to grow with the parameters)")
    hidden, how = table_hidden(table)
    if hidden:
        act = (f"pipeline by the activation at the cut, batch x seq_len x hidden (x{plan.activation_scale:.3g}; "
               f"table hidden {hidden:.0f} from {how})")
    else:
        act = "pipeline by tokens per step alone (the table gives no hidden size to scale by)"
    if size:
        lines.append(f"WAN bytes: the table's, scaled for all-reduce, diloco and federated by job/table parameters "
                     f"(x{plan.param_scale:.3g}) and for the {act}; each codec keeps its measured bytes ratio; step "
                     "time from nebula.plan.link.predicted_wall_s")
    else:
        lines.append("WAN bytes: the table's as measured per step; step time from "
                     "nebula.plan.link.predicted_wall_s")
    lines.append(_recommendation(plan))
    return "\n".join(lines)


def _recommendation(plan: Plan) -> str:
    tol = f"{plan.tolerance * 100:g}%"
    r = plan.recommended
    line = (f"recommendation: {r.name} -- {_secs(r.step_s)} s per step, {_bytes(r.wan_bytes)} over the WAN per "
            f"step, held-out loss {r.quality_cost * 100:+.2f}% vs one cluster (within {tol})")
    if plan.ties:
        line += (f"; ties within {TIE * 100:g}% of its step time with {', '.join(t.name for t in plan.ties)}, "
                 "chosen for the lower quality cost, then fewer WAN bytes")
    return line
