"""Quality-per-WAN-byte rows through real switches: a `diloco` or `pipeline` row (`nebula.quality.RowSpec`) trained
by `nebula launch` in two clusters joined by two real switch servers (TLS between them, the link shaped or not), so
the one-process rows of `nebula.quality.engine` can be checked against the runtime and the link model
(`nebula.plan.link`) against a shaped link.

`run_real` provisions a throwaway federation (clusters A and B, `benchmarks/_federation.py`), writes the job file
(`nebula.formers:CausalLMRecipe` on the given checkpoint and text; `mode: data_parallel` with DiLoCo's outer step for
`diloco`, `mode: pipeline` with the codec at the cut for `pipeline`), runs `nebula launch JOB --cluster A/B`, stops
everything it started, and returns the held-out loss of the final checkpoint, the WAN bytes, wall and step times.

WAN bytes are the runtime's own count of what each cluster sent across the WAN during training (`bytes_sent` of
every rank's metrics: the DiLoCo leaders' messages to the other cluster, or a pipeline boundary's headers and encoded
frames, both directions, both clusters); that is what the one-process engine counts, frame for frame. The switches'
own counters (frames the two switches put on their link during the run, which also hold the DiLoCo start-up
handshake's full-precision models, the pipeline's start-up control messages and the switches' link upkeep) are
returned beside it as `switch_bytes`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from _federation import Federation  # (benchmarks/ is on the path of whatever imports this)

from nebula.quality.rows import RowSpec, Traffic

__all__ = ["RealRun", "run_real", "heldout_of", "traffic_of", "DILOCO_OUTER"]

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
CLUSTERS = ("A", "B")
DILOCO_OUTER = {"algorithm": "diloco", "lr": 0.7, "momentum": 0.9}  # the outer step of every diloco row
WARMUP_STEPS = 3  # per-step times before this are start-up (first forward, allocator, links filling)


@dataclass(frozen=True)
class RealRun:
    """What one row measured through real switches.

    `wall_s`: training wall time, from the first step's start to the last step's end over both clusters (process
    start-up, imports and the start-up handshake excluded: what the link model predicts); `step_s`: median time
    between consecutive steps after `WARMUP_STEPS` (the steady state: for DiLoCo a step without a sync);
    `wan_bytes`: bytes the clusters sent each other while training (metrics' `bytes_sent`, both directions);
    `switch_bytes`: frames the two switches put on their link during the run (start-up and upkeep included);
    `traffic`: the run's exchanges as measured, for `nebula.plan.link.predicted_wall_s`; `sync_s`: per DiLoCo sync,
    the time it held the run up (`_sync_times`; empty for pipeline); `launch_s`: from starting `nebula launch` to
    both exits; `train_loss`: mean training loss of the last `WARMUP_STEPS` steps (both replicas for DiLoCo).
    """

    heldout_loss: float
    wan_bytes: int
    wall_s: float
    step_s: float
    steps: int
    run_dir: Path
    switch_bytes: int = 0
    traffic: Traffic = field(default_factory=Traffic)
    sync_s: tuple[float, ...] = ()
    launch_s: float = 0.0
    train_loss: float = float("nan")

    def __post_init__(self) -> None:
        if self.steps < 1 or self.wan_bytes < 0 or not self.wall_s >= 0:
            raise ValueError(f"real run: steps={self.steps}, wan_bytes={self.wan_bytes}, wall_s={self.wall_s} "
                             "out of range")


def run_real(spec: RowSpec, *, model_dir: Path, train: Path, heldout: Path, steps: int, global_batch: int,
             seq_len: int, lr: float, seed: int, rate_mbit: float | None, delay_ms: float, workdir: Path,
             micro_batches: int = 2, timeout_s: float = 3600.0, heldout_examples: int | None = None) -> RealRun:
    """Train row `spec` (mode diloco or pipeline) through two real switches; see the module docstring.

    `global_batch` is the examples of one step over both clusters, as `nebula.quality.engine.Budget` counts them
    (DiLoCo: each cluster's block is half of it, the job's `train.global_batch`); `micro_batches` splits the
    pipeline's batch (DiLoCo's replicas take their block whole, as the engine's do). The link is shaped to
    `rate_mbit` (None: unshaped loopback) with `delay_ms` one way on each switch. Everything runs under a fresh
    directory in `workdir`, which is kept (metrics, checkpoints, logs) and named by `RealRun.run_dir`.
    """
    if spec.mode not in ("diloco", "pipeline"):
        raise ValueError(f"run_real: row mode {spec.mode!r} does not run through switches here; give diloco or "
                         "pipeline")
    parts = micro_batches if spec.mode == "pipeline" else len(CLUSTERS)
    if steps < 1 or global_batch < 1 or micro_batches < 1 or global_batch % parts:
        raise ValueError(f"run_real: steps={steps} and global_batch={global_batch} must be >= 1 and global_batch "
                         f"a multiple of {parts} ({'micro-batches' if spec.mode == 'pipeline' else 'clusters'})")
    model_dir, train, heldout = (Path(p).resolve() for p in (model_dir, train, heldout))
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    shaped = f"{rate_mbit:g}mbit" if rate_mbit else "unshaped"
    run_dir = workdir / f"{spec.mode}-{spec.codec}-{shaped}-{time.strftime('%H%M%S')}-{os.getpid()}"
    n = 0
    while (run_dir.with_name(f"{run_dir.name}-{n}")).exists():
        n += 1
    run_dir = run_dir.with_name(f"{run_dir.name}-{n}").resolve()
    run_dir.mkdir(parents=True)
    fed = Federation(run_dir / "fed", list(CLUSTERS), rate_mbit, delay_ms, name="wanq")
    try:
        job = _write_job(run_dir, spec, fed, model_dir=model_dir, train=train, steps=steps,
                         global_batch=global_batch, seq_len=seq_len, lr=lr, seed=seed, micro_batches=micro_batches)
        before = _link_bytes(fed, time.time())
        t0 = time.monotonic()
        _launch(job, timeout_s)
        launch_s = time.monotonic() - t0
    finally:
        fed.close()  # the switches write their final status on the way out
    switch_bytes = _link_bytes(fed, None) - before
    recs = {c: _metrics(run_dir / "metrics", c) for c in CLUSTERS}
    for c, rs in recs.items():
        if len(rs) != steps:
            raise RuntimeError(f"{run_dir}: cluster {c} recorded {len(rs)} steps of {steps}; see its log in "
                               f"{run_dir / f'launch_{c}.log'}")
    wall, step_s = _times(recs)
    wan = sum(int(r["bytes_sent"]) for rs in recs.values() for r in rs)
    state = _final_state(run_dir, spec.mode, steps)
    loss = heldout_of(model_dir, train, heldout, seq_len, seed, state=state,
                      num_stages=2 if spec.mode == "pipeline" else 1, max_examples=heldout_examples)
    last = recs["B"] if spec.mode == "pipeline" else None
    train_loss = (float(np.mean([r["loss"] for r in last[-WARMUP_STEPS:]])) if last is not None else
                  float(np.mean([r["loss"] for rs in recs.values() for r in rs[-WARMUP_STEPS:]])))
    syncs = _sync_times(recs) if spec.mode == "diloco" else ()
    return RealRun(heldout_loss=loss, wan_bytes=wan, wall_s=wall, step_s=step_s, steps=steps, run_dir=run_dir,
                   switch_bytes=switch_bytes, traffic=traffic_of(spec, recs), sync_s=syncs, launch_s=launch_s,
                   train_loss=train_loss)


# ---- the job ------------------------------------------------------------------------------------------------------
def _write_job(run_dir: Path, spec: RowSpec, fed: Any, *, model_dir: Path, train: Path, steps: int,
               global_batch: int, seq_len: int, lr: float, seed: int, micro_batches: int) -> Path:
    """The job file of `spec` in `run_dir` (absolute paths: it runs from any directory)."""
    pipeline = spec.mode == "pipeline"
    args = {"from_pretrained": str(model_dir), "data": str(train), "seq_len": seq_len, "lr": lr,
            "num_stages": 2 if pipeline else 1, "optimizer": "adamw"}
    doc: dict[str, Any] = {
        "job": f"wanq-{run_dir.name}",  # a fresh job name: fresh channels on the switches
        "mode": "pipeline" if pipeline else "data_parallel",
        "recipe": {"factory": "nebula.formers:CausalLMRecipe", "args": args},
        "clusters": [{"id": c, "device": "cpu", "procs_per_node": 1, "worker": fed.worker(c)} for c in CLUSTERS],
        "train": {"steps": steps, "global_batch": global_batch if pipeline else global_batch // len(CLUSTERS),
                  "micro_batches": micro_batches if pipeline else 1, "seed": seed},
    }
    if pipeline:
        doc["stages"] = [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "B"}]
        doc["train"]["stale_weights"] = spec.stale_weights
        doc["compression"] = {"forward": spec.codec, "backward": spec.grad_codec or spec.codec}
    else:
        doc["data_parallel"] = {"sync_every": spec.sync_every, "outer": {**DILOCO_OUTER, "codec": spec.codec}}
    doc.update({"checkpoint": {"dir": str(run_dir / "ckpt")},
                "metrics": {"dir": str(run_dir / "metrics"), "progress": False}, "peer_timeout_s": 300})
    path = run_dir / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _launch(job: Path, timeout_s: float) -> None:
    """`nebula launch JOB --cluster C` for both clusters at once; RuntimeError with the log's end if one fails.
    Each runs in its own process group, killed if it is still running when this returns."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    procs, logs = [], []
    try:
        for c in CLUSTERS:
            log = open(job.parent / f"launch_{c}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen([str(BIN / "nebula"), "launch", str(job), "--cluster", c],
                                          cwd=job.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout_s
        pending = dict(zip(CLUSTERS, procs))
        while pending:  # a cluster that fails stops the wait at once (its peer would wait out peer_timeout_s)
            for c, p in list(pending.items()):
                if p.poll() is None:
                    continue
                del pending[c]
                if p.returncode != 0:
                    tail = (job.parent / f"launch_{c}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{job}: cluster {c} exited {p.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{job}: clusters {sorted(pending)} still running after {timeout_s:g} s")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
        for log in logs:
            log.close()


def _kill_group(p: subprocess.Popen) -> None:
    """SIGTERM `p`'s process group, SIGKILL after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ---- what the run measured ------------------------------------------------------------------------------------------
def _link_bytes(fed: Any, since: float | None, timeout_s: float = 10.0) -> int:
    """Bytes both switches have put on their WAN links (status.json's links.*.bytes_out), from a status written at
    or after `since` (None: the last one written, e.g. on stop)."""
    from nebula.config import load_switch_config
    from switch_server.status import status_path

    total = 0
    for c in CLUSTERS:
        path = status_path(load_switch_config(fed.switch_yaml(c)))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                st = json.loads(path.read_text())
            except (OSError, ValueError):  # not written yet, or being replaced
                st = {"time": 0.0}
            if st["time"] > 0 and (since is None or st["time"] >= since):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"switch {c}: no status written after {since} in {path}")
            time.sleep(0.1)
        total += sum(int(link["bytes_out"]) for link in st.get("links", {}).values())
    return total


def _metrics(directory: Path, cluster: str) -> list[dict]:
    from nebula.pipeline.metrics import read_metrics

    path = directory / f"{cluster}.rank0.jsonl"
    if not path.is_file():
        raise RuntimeError(f"{path} missing: cluster {cluster} recorded no step")
    return read_metrics(path)


def _times(recs: dict[str, list[dict]]) -> tuple[float, float]:
    """(training wall time, steady-state step time): the wall from the earliest step start to the latest step end;
    the step time as the median gap between consecutive step ends after the warm-up, on the cluster finishing last
    (the pipeline's last stage, or the slower DiLoCo replica)."""
    start = min(rs[0]["time"] - rs[0]["step_s"] for rs in recs.values())
    end = max(rs[-1]["time"] for rs in recs.values())
    ends = np.max([[r["time"] for r in rs] for rs in recs.values()], axis=0)
    gaps = np.diff(ends)[WARMUP_STEPS:] if len(ends) > WARMUP_STEPS + 1 else np.diff(ends)
    step_s = float(np.median(gaps)) if len(gaps) else float(end - start)
    return float(end - start), step_s


def _sync_times(recs: dict[str, list[dict]]) -> tuple[float, ...]:
    """Per DiLoCo sync, the time it held the run up: from the later cluster entering it to the later one leaving
    it (the earlier cluster's wait for the other to arrive is compute skew, not the link)."""
    out = []
    for i, first in enumerate(recs[CLUSTERS[0]]):
        if first.get("synced"):
            rs = [recs[c][i] for c in CLUSTERS]
            out.append(max(r["time"] for r in rs) - max(r["time"] - r["sync_s"] for r in rs))
    return tuple(round(x, 6) for x in out)


def traffic_of(spec: RowSpec, recs: dict[str, list[dict]]) -> Traffic:
    """The run's WAN exchanges as its metrics show them, in the link model's terms (`nebula.quality.Traffic`).

    DiLoCo: one exchange per sync, both leaders sending at once, the larger one-way share (bytes), one one-way
    latency. Pipeline: one exchange per step, the larger of a step's activations (A) and gradients (B); two one-way
    latencies (activations out, gradients back), overlapped with compute for stale weights.
    """
    if spec.mode == "diloco":
        sent = [max(int(recs[c][i]["bytes_sent"]) for c in CLUSTERS) for i in range(len(recs["A"]))
                if recs["A"][i].get("synced")]
        return Traffic(exchanges=len(sent), bytes_per_exchange=float(np.mean(sent)) if sent else 0.0,
                       latencies_per_exchange=1.0)
    per_step = [max(int(a["bytes_sent"]), int(b["bytes_sent"])) for a, b in zip(recs["A"], recs["B"])]
    body = per_step[1:] if len(per_step) > 1 else per_step  # step 0 also carries the start-up control messages
    return Traffic(exchanges=len(per_step), bytes_per_exchange=float(np.mean(body)), latencies_per_exchange=2.0,
                   overlapped=spec.stale_weights > 0)


# ---- the final model ------------------------------------------------------------------------------------------------
def _final_state(run_dir: Path, mode: str, steps: int) -> dict[str, Any]:
    """The final model's parameters under the full Sequential's names ("<layer index>.<name>").

    Each stage's checkpoint holds a Sequential of its layer range, named from 0; the layer at position i of a
    stage starting at layer `start` is layer start + i of the whole model. DiLoCo's replicas hold the same weights
    after the last sync, so cluster A's is the model."""
    import paddle

    from nebula.pipeline.checkpoint import step_dir

    root = run_dir / "ckpt" / ("A" if mode == "diloco" else "")
    d = step_dir(root, steps)
    args = yaml.safe_load((run_dir / "job.yaml").read_text())["recipe"]["args"]
    recipe = _recipe(Path(args["from_pretrained"]), Path(args["data"]), args["seq_len"], args["num_stages"])
    names = list(recipe.stage_names)
    state: dict[str, Any] = {}
    for i, name in enumerate(names):
        f = d / name / "model.pdparams"
        if not f.is_file():
            raise RuntimeError(f"{f} missing: the run saved no final checkpoint of stage {name!r}")
        start = recipe.bounds[i]
        for key, value in paddle.load(str(f)).items():
            pos, _, rest = key.partition(".")
            state[f"{int(pos) + start}.{rest}"] = value
    return state


_RECIPES: dict[tuple, Any] = {}


def _recipe(model_dir: Path, train: Path, seq_len: int, num_stages: int) -> Any:
    """The runs' recipe (the same stages and bounds), built once per process and arguments: it tokenizes the
    training text and reads the checkpoint."""
    from nebula.formers import CausalLMRecipe

    key = (str(model_dir), str(train), int(seq_len), int(num_stages))
    if key not in _RECIPES:
        _RECIPES[key] = CausalLMRecipe(from_pretrained=str(model_dir), data=str(train), seq_len=seq_len,
                                       num_stages=num_stages)
    return _RECIPES[key]


def heldout_of(model_dir: Path, train: Path, heldout: Path, seq_len: int, seed: int, *,
               state: dict[str, Any] | None = None, num_stages: int = 1, max_examples: int | None = None) -> float:
    """Held-out loss of the checkpoint in `model_dir` (state None: as saved) or of `state` loaded into it, on the
    first `max_examples` (None: all) lines of `heldout` (`nebula.quality.evaluate.heldout_loss`), as the engine's
    `Bench` reads them."""
    from nebula.formers.data import TokenData, load_tokenizer, read_lines
    from nebula.quality.evaluate import build_full, heldout_loss

    recipe = _recipe(Path(model_dir).resolve(), Path(train).resolve(), seq_len, num_stages)
    layered = recipe.layered()
    model = build_full(layered, seed)
    if state is not None:
        own = model.state_dict()
        if set(own) != set(state):
            raise RuntimeError(f"checkpoint names {sorted(set(state) ^ set(own))[:6]} do not map onto the full "
                               "model's; the stages' bounds differ from this recipe's")
        model.set_state_dict(state)
    model.eval()
    data = TokenData(read_lines(heldout, "heldout")[:max_examples], load_tokenizer(model_dir), seq_len)
    return heldout_loss(model, layered, data)
