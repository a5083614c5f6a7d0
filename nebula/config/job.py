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

`mode: data_parallel` lists no stages: every cluster trains the whole model on its own share of the data and the
clusters average every `data_parallel.sync_every` steps over the WAN (`DataParallelSpec`, nebula.dataparallel).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from nebula.config.job_sections import (DEVICES, AllocationSpec, CheckpointSpec, ClusterSpec, CompressionConfig,
                                       DataParallelSpec, MetricsSpec, OneWaySpec, OuterSpec, PipelineSpec,
                                       RecipeSpec, StageSpec, TrainSpec, WanSpec)
from nebula.config.schema import ConfigError, load_yaml
from nebula.config.schema import resolve_path as _resolve
from nebula.config.modes import LAUNCHED, LaunchedMode, ModeName

__all__ = ["JobConfig", "load_job_config", "resolve_job_paths", "MODES", "DEVICES", "AllocationSpec",
           "CheckpointSpec", "ClusterSpec", "CompressionConfig", "DataParallelSpec", "MetricsSpec", "OneWaySpec",
           "OuterSpec", "PipelineSpec", "RecipeSpec", "StageSpec", "TrainSpec", "WanSpec"]

MODES = LAUNCHED  # a job file's `mode:` values (nebula.config.modes)


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    """A whole job: every cluster reads this same file and runs its own stages."""

    job: str
    recipe: RecipeSpec
    clusters: tuple[ClusterSpec, ...]
    stages: tuple[StageSpec, ...] = ()  # empty in mode data_parallel (every cluster runs every stage)
    train: TrainSpec
    mode: LaunchedMode = ModeName.PIPELINE.value
    data_parallel: DataParallelSpec = field(default_factory=DataParallelSpec)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    oneway: OneWaySpec = field(default_factory=OneWaySpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    peer_timeout_s: float = 120.0  # how long a rank waits for a silent peer cluster before exiting
    startup_timeout_s: float = 600.0  # how long a starting rank waits for the peer clusters to start
    # whole-job recovery (docs/recovery.md): a lost peer cluster is waited for this long at the step boundary, all
    # clusters then resume from the newest checkpoint every one holds; 0 = off (a lost peer ends the job, exit 3)
    recovery_timeout_s: float = 0.0
    # cut between clusters by an allocator instead of by hand: a method name or an AllocationSpec mapping
    allocation: Any = None

    @property
    def allocation_spec(self) -> AllocationSpec | None:
        """`allocation` as a spec (a bare method name means default profiles and WAN)."""
        return self.allocation

    def __post_init__(self) -> None:
        if isinstance(self.allocation, str):
            object.__setattr__(self, "allocation", AllocationSpec(method=self.allocation))
        elif isinstance(self.allocation, dict):
            from nebula.config.schema import from_dict

            object.__setattr__(self, "allocation", from_dict(AllocationSpec, self.allocation, "allocation"))
        elif self.allocation is not None and not isinstance(self.allocation, AllocationSpec):
            raise ValueError(f"allocation={self.allocation!r} must be a method name (e.g. optimal) or a mapping "
                             "with method, profiles, wan")
        if not self.job or "/" in self.job:
            raise ValueError(f"job {self.job!r} must be a non-empty name without '/'")
        if not self.clusters:
            raise ValueError("clusters is empty; list at least one cluster")
        ids = [c.id for c in self.clusters]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"cluster {sorted(dup)[0]!r} is listed twice under clusters")
        if self.peer_timeout_s <= 0 or self.startup_timeout_s <= 0:
            raise ValueError(f"peer_timeout_s={self.peer_timeout_s} and startup_timeout_s={self.startup_timeout_s} "
                             "must be > 0")
        if self.train.stale_weights and (self.mode != ModeName.PIPELINE or any(c.pipeline for c in self.clusters)):
            inside = " with a layer pipeline inside a cluster" if self.mode == ModeName.PIPELINE else ""
            raise ValueError(f"train.stale_weights={self.train.stale_weights} delays updates between the clusters "
                             f"of mode pipeline; this job is mode {self.mode}{inside}: set train.stale_weights: 0")
        self._check_recovery()
        if self.mode == ModeName.DATA_PARALLEL:
            self._check_data_parallel()
            return
        if not self.stages:
            raise ValueError("stages is empty; list the recipe's stages with the cluster of each")
        for s in self.stages:
            if s.cluster not in ids:
                raise ValueError(f"stage {s.name!r} runs on cluster {s.cluster!r}, which is not under clusters "
                                 f"(known: {', '.join(ids)})")
        segs = [c for i, c in enumerate(s.cluster for s in self.stages) if i == 0 or self.stages[i - 1].cluster != c]
        if len(set(segs)) != len(segs):
            raise ValueError(f"stages visit a cluster twice ({' -> '.join(segs)}); give each cluster one contiguous "
                             "run of stages")
        self._check_pairing(segs)

    def _check_recovery(self) -> None:
        """Recovery resumes every cluster from a checkpoint all of them hold: it needs checkpoints to resume from."""
        t, ck = self.recovery_timeout_s, self.checkpoint
        if t < 0:
            raise ValueError(f"recovery_timeout_s={t} must be >= 0 (0 turns recovery off)")
        if t == 0:
            return
        if self.mode == ModeName.ONEWAY and self.oneway.k == "auto":
            raise ValueError(f"recovery_timeout_s={t:g} with oneway.k: auto: a relaunched cluster cannot probe k "
                             "while the others wait for it; set oneway.k to a number (the one auto chose is in the "
                             "receiver's log), or recovery_timeout_s: 0")
        if not ck.dir or not ck.every or not ck.resume:
            raise ValueError(f"recovery_timeout_s={t:g} resumes every cluster from a common checkpoint: set "
                             f"checkpoint.dir, checkpoint.every > 0 and checkpoint.resume: true (now dir={ck.dir!r}, "
                             f"every={ck.every}, resume={ck.resume}), or recovery_timeout_s: 0")

    def _check_pairing(self, segs: list[str]) -> None:
        if self.mode == ModeName.ONEWAY:
            self._check_oneway(segs)
            return
        piped = [c for c in self.clusters if c.pipeline is not None]
        if piped and len(segs) > 1:
            raise ValueError(f"cluster {piped[0].id} has a pipeline: a layer pipeline inside a cluster runs in a "
                             "job of one cluster; remove clusters[].pipeline or run the stages in one cluster")
        if piped:
            pp = piped[0].pipeline
            replicas = piped[0].world_size // pp.num_stages
            if self.train.global_batch % (replicas * self.train.micro_batches):
                raise ValueError(f"train.global_batch={self.train.global_batch} must divide evenly over {replicas} "
                                 f"replicas x {self.train.micro_batches} micro-batches")
            return
        sizes = {c: self.cluster(c).world_size for c in segs}
        if len(set(sizes.values())) != 1:
            raise ValueError("ranks do not pair up: pipeline clusters need equal rank counts (rank r talks to rank r), "
                             f"got {', '.join(f'{c}={n}' for c, n in sizes.items())}; change procs_per_node/nodes")
        world = next(iter(sizes.values()))
        if self.train.global_batch % (world * self.train.micro_batches):
            raise ValueError(f"train.global_batch={self.train.global_batch} must divide evenly over {world} ranks x "
                             f"{self.train.micro_batches} micro-batches")

    def _check_data_parallel(self) -> None:
        """Every cluster runs the whole model on its own `train.global_batch` examples per step."""
        if self.stages:
            raise ValueError("mode data_parallel runs every stage in every cluster; remove stages")
        for c in self.clusters:
            if c.pipeline is not None:
                raise ValueError(f"cluster {c.id}: mode data_parallel runs ranks data parallel; remove "
                                 f"clusters[{c.id}].pipeline")
            if self.train.global_batch % (c.world_size * self.train.micro_batches):
                raise ValueError(f"train.global_batch={self.train.global_batch} (examples per step in each cluster) "
                                 f"must divide evenly over cluster {c.id}'s {c.world_size} ranks x "
                                 f"{self.train.micro_batches} micro-batches")

    def _check_oneway(self, segs: list[str]) -> None:
        """Scenario I: every cluster but the last sends (one generator each, M3), the last receives; sender rank s
        feeds receiver ranks s*k..s*k+k-1 (receiver ranks beyond them idle); all on one cluster: local hand-off."""
        k, t = self.oneway.k, self.train
        piped = [c.id for c in self.clusters if c.pipeline is not None]
        if piped:
            raise ValueError(f"cluster {piped[0]} has a pipeline: a layer pipeline inside a cluster runs in mode "
                             f"pipeline; remove clusters[{piped[0]}].pipeline or set mode: pipeline")
        if len(segs) == 1:
            c = self.cluster(segs[0])
            if c.world_size != 1:
                raise ValueError(f"mode oneway with every stage on cluster {c.id} (local hand-off) runs on one rank, "
                                 f"it has {c.world_size}; set procs_per_node: 1 or place the stages on several "
                                 "clusters")
            return
        rcv = self.cluster(segs[-1])
        senders = sum(self.cluster(c).world_size for c in segs[:-1])
        if k == "auto":
            if rcv.world_size < senders:
                raise ValueError(f"ranks do not pair up: {senders} sender rank(s) need at least as many ranks on "
                                 f"receiver cluster {rcv.id}, it has {rcv.world_size}; change procs_per_node/nodes")
            return
        if senders * k > rcv.world_size:
            raise ValueError(f"ranks do not pair up: oneway.k={k} needs cluster {rcv.id} to have {senders * k} ranks "
                             f"({senders} sender rank(s) x k), it has {rcv.world_size}: k is larger than the ranks "
                             f"available; lower oneway.k to at most {max(rcv.world_size // senders, 1)}, use k: auto, "
                             f"or give cluster {rcv.id} more ranks (procs_per_node/nodes)")
        if t.global_batch % (senders * k * t.micro_batches):
            raise ValueError(f"train.global_batch={t.global_batch} must divide evenly over {senders * k} receiver "
                             f"ranks x {t.micro_batches} micro-batches")

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
        """The same job run entirely inside `cluster_id` (`nebula launch --intra`, the comparison run), stating the
        mode its ranks run there: a data-parallel job's replica alone (no WAN), a one-way job of several senders as
        a local hand-off, any other job as `in_one_cluster` (its stages back to back)."""
        self.cluster(cluster_id)
        if self.mode == ModeName.DATA_PARALLEL:
            return dataclasses.replace(self, clusters=(self.cluster(cluster_id),))
        if self.mode == ModeName.ONEWAY and len(self.segments) > 2:  # (not chained: each sender hands off locally)
            return dataclasses.replace(self, stages=tuple(dataclasses.replace(s, cluster=cluster_id)
                                                          for s in self.stages))
        return self.in_one_cluster(cluster_id)

    def in_one_cluster(self, cluster_id: str, stage_names: Sequence[str] | None = None) -> "JobConfig":
        """The job as the stage runner runs it in `cluster_id` alone: `stage_names` (default: the job's stages) back
        to back there, which is the pipeline schedule of one segment, so the result states mode pipeline whatever
        the job file's mode (what a mode adds on top, e.g. data_parallel's outer steps, comes with its hooks)."""
        self.cluster(cluster_id)
        names = [s.name for s in self.stages] if stage_names is None else list(stage_names)
        return dataclasses.replace(self, mode=ModeName.PIPELINE.value,
                                   stages=tuple(StageSpec(name=n, cluster=cluster_id) for n in names))


def resolve_job_paths(cfg: JobConfig, base: Path) -> JobConfig:
    """Return `cfg` with relative paths made absolute against `base` (the job file's directory)."""
    clusters = tuple(dataclasses.replace(c, worker=_resolve(c.worker, base)) for c in cfg.clusters)
    ck = cfg.checkpoint
    ck = dataclasses.replace(ck, dir=_resolve(ck.dir, base), init_from=_resolve(ck.init_from, base))
    mt = dataclasses.replace(cfg.metrics, dir=_resolve(cfg.metrics.dir, base))
    al = cfg.allocation_spec
    if al is not None:
        files = {c: al.profiles.get(c, f"profiles/{c}.yaml") for c, _ in cfg.segments}
        al = dataclasses.replace(al, profiles={c: _resolve(f, base) for c, f in {**al.profiles, **files}.items()})
    return dataclasses.replace(cfg, clusters=clusters, checkpoint=ck, metrics=mt, allocation=al)


def load_job_config(file: str | Path) -> JobConfig:
    """Load a job YAML file; structural errors name the file and the key (no recipe import, no file checks)."""
    file = Path(file)
    cfg = load_yaml(JobConfig, file)
    return resolve_job_paths(cfg, file.resolve().parent)

