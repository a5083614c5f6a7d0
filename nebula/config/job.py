"""Job configuration (`job.yaml`): clusters, the model split into stages, codecs, training, checkpoints.

One file describes the whole federated job; every cluster starts its part with the same file
(`nebula launch job.yaml --cluster A`). Relative paths (worker files, checkpoint and metrics directories,
hot-start checkpoints) are resolved against the job file's directory by `load_job_config`.

Example::

    job: toy
    mode: pipeline                 # pipeline (Scenario II: activations forward, gradients back) | oneway (Scenario I)
    recipe: {factory: "recipes.toy:ToyRecipe", args: {hidden: 16}}
    clusters:
      - {id: A, device: cpu, procs_per_node: 2, worker: prov/A/worker.yaml}
      - {id: B, device: cpu, procs_per_node: 2, worker: prov/B/worker.yaml}
    stages:                        # in model order; consecutive stages on one cluster run there back to back
      - {name: encoder, cluster: A}
      - {name: decoder, cluster: B}
    train: {steps: 20, global_batch: 16, micro_batches: 2, seed: 1}
    compression: {forward: "fp16(svd(0.6))", backward: int8, start_step: 0}
    checkpoint: {dir: ckpt, every: 10}
    metrics: {dir: metrics}
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nebula.compress.config import CompressionConfig
from nebula.config._schema import ConfigError, load_yaml

DEVICES = ("cpu", "gpu", "npu", "xpu")
MODES = ("pipeline", "oneway")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """One cluster of the job: where its ranks run and how they reach their switch server."""

    id: str
    device: Literal["cpu", "gpu", "npu", "xpu"] = "cpu"  # passed to paddle.set_device on every rank
    nodes: int = 1  # machines of this cluster taking part
    procs_per_node: int = 1  # ranks per machine (paddle.distributed.launch --nproc_per_node)
    worker: str | None = None  # worker.yaml of this cluster's switch; required when the job spans clusters
    master: str | None = None  # host:port of node 0's rendezvous, needed only when nodes > 1

    def __post_init__(self) -> None:
        if not self.id or not self.id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"cluster id {self.id!r} must be a non-empty name of letters, digits, '-' or '_'")
        if self.nodes < 1:
            raise ValueError(f"cluster {self.id}: nodes={self.nodes} must be >= 1")
        if self.procs_per_node < 1:
            raise ValueError(f"cluster {self.id}: procs_per_node={self.procs_per_node} must be >= 1")
        if self.nodes > 1 and not self.master:
            raise ValueError(f"cluster {self.id}: nodes={self.nodes} needs master: <host:port of node 0>")

    @property
    def world_size(self) -> int:
        """Ranks of this cluster (data-parallel replicas of its stages)."""
        return self.nodes * self.procs_per_node


@dataclass(frozen=True, kw_only=True, slots=True)
class StageSpec:
    """A stage of the model (named by the recipe) and the cluster that runs it."""

    name: str
    cluster: str


@dataclass(frozen=True, kw_only=True, slots=True)
class RecipeSpec:
    """Which recipe builds the stages: `factory` is "module:attr", called as factory(**args)."""

    factory: str
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        mod, sep, attr = self.factory.partition(":")
        if not sep or not mod or not attr:
            raise ValueError(f"recipe.factory {self.factory!r} must be 'module:attr', e.g. 'recipes.toy:ToyRecipe'")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSpec:
    """Training loop: steps, batch split and seed (shared by all clusters, which keeps their data aligned)."""

    steps: int
    global_batch: int  # examples per optimizer step over all ranks of a stage's cluster
    micro_batches: int = 1  # micro-batches per rank and step (the pipeline depth)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"train.steps={self.steps} must be >= 1")
        if self.global_batch < 1 or self.micro_batches < 1:
            raise ValueError("train.global_batch and train.micro_batches must be >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class OneWaySpec:
    """Scenario I: one sender rank feeds k receiver ranks through a root; sync tensor after every step."""

    k: int = 1  # receivers per sender rank (from the measured speeds of the two sides)
    sync_lag: int = 1  # steps the sender may run ahead of the receivers' last sync (0 = lock-step)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"oneway.k={self.k} must be >= 1")
        if self.sync_lag < 0:
            raise ValueError(f"oneway.sync_lag={self.sync_lag} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSpec:
    """Consistent checkpoints: every cluster saves its stages at the same steps."""

    dir: str | None = None  # None disables saving
    every: int = 0  # save every this many steps (0: only at the end)
    keep: int = 3  # newest checkpoints kept per cluster
    resume: bool = True  # continue from the newest step that every cluster has
    init_from: str | None = None  # hot start: a step directory (e.g. from an intra-cluster run) to load weights from

    def __post_init__(self) -> None:
        if self.every < 0 or self.keep < 1:
            raise ValueError(f"checkpoint.every={self.every} must be >= 0 and checkpoint.keep={self.keep} >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricsSpec:
    """Per-step metrics as JSON lines (one file per cluster and rank) and a progress bar on rank 0."""

    dir: str | None = "metrics"
    progress: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    """A whole job: every cluster reads this same file and runs its own stages."""

    job: str
    recipe: RecipeSpec
    clusters: tuple[ClusterSpec, ...]
    stages: tuple[StageSpec, ...]
    train: TrainSpec
    mode: Literal["pipeline", "oneway"] = "pipeline"
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    oneway: OneWaySpec = field(default_factory=OneWaySpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    peer_timeout_s: float = 120.0  # how long a rank waits for a silent peer cluster before exiting
    startup_timeout_s: float = 600.0  # how long a starting rank waits for the peer clusters to start

    def __post_init__(self) -> None:
        if not self.job or "/" in self.job:
            raise ValueError(f"job {self.job!r} must be a non-empty name without '/'")
        if not self.clusters:
            raise ValueError("clusters is empty; list at least one cluster")
        if not self.stages:
            raise ValueError("stages is empty; list the recipe's stages with the cluster of each")
        ids = [c.id for c in self.clusters]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"cluster {sorted(dup)[0]!r} is listed twice under clusters")
        for s in self.stages:
            if s.cluster not in ids:
                raise ValueError(f"stage {s.name!r} runs on cluster {s.cluster!r}, which is not under clusters "
                                 f"(known: {', '.join(ids)})")
        segs = [c for i, c in enumerate(s.cluster for s in self.stages) if i == 0 or self.stages[i - 1].cluster != c]
        if len(set(segs)) != len(segs):
            raise ValueError(f"stages visit a cluster twice ({' -> '.join(segs)}); give each cluster one contiguous "
                             "run of stages")
        if self.peer_timeout_s <= 0 or self.startup_timeout_s <= 0:
            raise ValueError(f"peer_timeout_s={self.peer_timeout_s} and startup_timeout_s={self.startup_timeout_s} "
                             "must be > 0")
        self._check_pairing(segs)

    def _check_pairing(self, segs: list[str]) -> None:
        if self.mode == "oneway":
            if len(segs) != 2:
                raise ValueError(f"mode oneway needs exactly two clusters in stages (sender, receiver), got "
                                 f"{' -> '.join(segs)}; use mode: pipeline for other layouts")
            snd, rcv = self.cluster(segs[0]), self.cluster(segs[1])
            if rcv.world_size != snd.world_size * self.oneway.k:
                raise ValueError(f"ranks do not pair up: oneway.k={self.oneway.k} needs cluster {rcv.id} to have "
                                 f"{snd.world_size * self.oneway.k} ranks ({snd.world_size} x k), it has "
                                 f"{rcv.world_size}; change procs_per_node/nodes or oneway.k")
            per = self.train.global_batch % (rcv.world_size * self.train.micro_batches)
            if per:
                raise ValueError(f"train.global_batch={self.train.global_batch} must divide evenly over "
                                 f"{rcv.world_size} receiver ranks x {self.train.micro_batches} micro-batches")
            return
        sizes = {c: self.cluster(c).world_size for c in segs}
        if len(set(sizes.values())) != 1:
            raise ValueError("ranks do not pair up: pipeline clusters need equal rank counts (rank r talks to rank r), "
                             f"got {', '.join(f'{c}={n}' for c, n in sizes.items())}; change procs_per_node/nodes")
        world = next(iter(sizes.values()))
        if self.train.global_batch % (world * self.train.micro_batches):
            raise ValueError(f"train.global_batch={self.train.global_batch} must divide evenly over {world} ranks x "
                             f"{self.train.micro_batches} micro-batches")

    def cluster(self, cluster_id: str) -> ClusterSpec:
        """The cluster entry named `cluster_id`, or ConfigError naming the known ones."""
        for c in self.clusters:
            if c.id == cluster_id:
                return c
        raise ConfigError(f"no cluster {cluster_id!r} in this job; known: {', '.join(c.id for c in self.clusters)}")

    @property
    def segments(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(cluster, its stage names) in model order; one segment per cluster taking part."""
        out: list[tuple[str, list[str]]] = []
        for s in self.stages:
            if out and out[-1][0] == s.cluster:
                out[-1][1].append(s.name)
            else:
                out.append((s.cluster, [s.name]))
        return tuple((c, tuple(n)) for c, n in out)

    @property
    def inter_cluster(self) -> bool:
        """True when stages span more than one cluster (boundaries go through the switch servers)."""
        return len(self.segments) > 1

    def intra(self, cluster_id: str) -> "JobConfig":
        """The same job run entirely inside `cluster_id` (the intra-cluster comparison mode)."""
        self.cluster(cluster_id)
        stages = tuple(dataclasses.replace(s, cluster=cluster_id) for s in self.stages)
        return dataclasses.replace(self, stages=stages, mode="pipeline")


def _resolve(p: str | None, base: Path) -> str | None:
    return p if p is None or Path(p).is_absolute() else str((base / p).resolve())


def resolve_job_paths(cfg: JobConfig, base: Path) -> JobConfig:
    """Return `cfg` with relative paths made absolute against `base` (the job file's directory)."""
    clusters = tuple(dataclasses.replace(c, worker=_resolve(c.worker, base)) for c in cfg.clusters)
    ck = cfg.checkpoint
    ck = dataclasses.replace(ck, dir=_resolve(ck.dir, base), init_from=_resolve(ck.init_from, base))
    mt = dataclasses.replace(cfg.metrics, dir=_resolve(cfg.metrics.dir, base))
    return dataclasses.replace(cfg, clusters=clusters, checkpoint=ck, metrics=mt)


def load_job_config(file: str | Path) -> JobConfig:
    """Load a job YAML file; structural errors name the file and the key (no recipe import, no file checks)."""
    file = Path(file)
    cfg = load_yaml(JobConfig, file)
    return resolve_job_paths(cfg, file.resolve().parent)

